//! CPU priority of the threads that do batch work.
//!
//! The micro-batch tier and the offline store run on threads of their own
//! (`threads.batch_workers`); on a busy machine they also yield the CPU to the threads
//! that serve real-time requests, by running at a higher nice value (lower priority).

/// Lowers the calling thread's CPU priority to `nice` (0..=19; 0 leaves it). Linux
/// only, where the nice value is per thread; elsewhere it does nothing. A failure is
/// logged once per thread and the thread runs on at its current priority.
pub fn lower_this_thread(nice: i32) {
    if nice <= 0 {
        return;
    }
    #[cfg(target_os = "linux")]
    if let Err(e) = rustix::process::setpriority_process(Some(rustix::thread::gettid()), nice.min(19)) {
        tracing::warn!(nice, error = %e, "cannot lower a batch thread's priority; it runs at the real-time threads' priority");
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn nice_of_this_thread() -> i32 {
        rustix::process::getpriority_process(Some(rustix::thread::gettid())).expect("getpriority")
    }

    #[test]
    fn lowers_only_the_calling_thread() {
        let before = nice_of_this_thread();
        let lowered = std::thread::spawn(move || {
            lower_this_thread(before + 5);
            nice_of_this_thread()
        })
        .join()
        .expect("thread ran");
        assert_eq!(lowered, (before + 5).min(19));
        assert_eq!(
            nice_of_this_thread(),
            before,
            "the test's own thread keeps its priority"
        );
    }
}
