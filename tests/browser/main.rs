//! The console's test in a real browser, a binary of its own: chromium takes the
//! machine's cores while it runs, and the integration tests beside it time things
//! (cargo runs test binaries one after another).

#[path = "../common/mod.rs"]
mod common;

mod console;
