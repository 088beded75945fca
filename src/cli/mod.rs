//! The command line's own modules (the binary's, not the library's): each subcommand
//! beside `serve` and `sim`, and the HTTP client they share.
//!
//! `admin` (`flags`, `policy diff|apply|history|rollback`, `explain`: the admin API),
//! `jobs` (the Batch API: submit, status, results, cancel), `shadow` (a route's shadow
//! candidate: report, reset, promote), `cache` (a route's cache: show, invalidate), `top` (a live view from the
//! metrics endpoint), `health` (readiness as an exit code), `demo` (a gateway and two
//! simulated pools in one process), `client` (one HTTP exchange).

pub mod admin;
pub mod cache;
pub mod client;
pub mod demo;
pub mod health;
pub mod jobs;
pub mod shadow;
pub mod top;
