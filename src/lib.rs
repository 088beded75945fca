//! tiergate: a hybrid tiered inference gateway.
pub mod app;
pub mod backend;
pub mod classify;
pub mod config;
pub mod error;
pub mod front;
pub mod metrics;
pub mod policy;
pub mod protocol;
pub mod sim;
pub mod tiers;
