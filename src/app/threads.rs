//! The micro-batch tier's runtime: its own threads, at their own priority and CPUs.

use std::future::Future;

use tokio::net::TcpListener;

use super::StartError;

/// The micro-batch tier's own runtime, so batch work never runs on the threads that
/// serve real-time requests. Shut down without blocking when the gateway goes.
#[derive(Debug)]
pub(super) struct BatchThreads(Option<tokio::runtime::Runtime>);

impl BatchThreads {
    /// Starts the threads `threads` describes (checked by [`super::settings::check`]).
    pub(super) fn start(threads: &crate::config::Threads) -> Result<BatchThreads, StartError> {
        let (nice, cpus) = (threads.batch_nice, threads.batch_cpus.clone());
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.batch_workers)
            .thread_name("tiergate-batch")
            .on_thread_start(move || {
                cpus.pin_this_thread();
                crate::cpu::lower_this_thread(nice);
            })
            .enable_all()
            .build()
            .map(|rt| BatchThreads(Some(rt)))
            .map_err(|e| StartError::Settings(format!("cannot start the micro-batch threads: {e}")))
    }

    pub(super) fn handle(&self) -> tokio::runtime::Handle {
        self.0
            .as_ref()
            .map(|rt| rt.handle().clone())
            .expect("running until dropped")
    }

    /// Runs the listener loop `listen` on the batch threads, `listener` moved to their
    /// reactor first so that its connections are accepted, read and answered there.
    pub(super) fn listen<F, Fut>(&self, listener: TcpListener, listen: F) -> impl Future<Output = std::io::Result<()>>
    where
        F: FnOnce(TcpListener) -> Fut + Send + 'static,
        Fut: Future<Output = std::io::Result<()>> + Send + 'static,
    {
        let moved = listener.into_std();
        let task = self
            .handle()
            .spawn(async move { listen(TcpListener::from_std(moved?)?).await });
        async move { task.await.map_err(std::io::Error::other)? }
    }
}

impl Drop for BatchThreads {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}
