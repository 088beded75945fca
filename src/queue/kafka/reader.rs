//! The reader of the jobs topic: reads this replica's partitions into [`Pending`],
//! stops while `max_in_flight` jobs are held, and every second writes a heartbeat and
//! takes or gives up partitions as replicas come and go (see [`runner::owned`]).

use std::time::Duration;

use bytes::Bytes;
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::producer::Producer;
use rdkafka::{Message, Offset};
use tokio_util::sync::CancellationToken;

use super::produce::Out;
use super::records::{self, JobMeta, Member, Record};
use super::runner::{self, Held, Take};
use super::{KafkaQueue, HEARTBEAT};

/// The partitions this replica reads, and the ones it will take at the next look.
#[derive(Debug, Default)]
struct Ownership {
    now: Vec<i32>,
    pending: Option<Vec<i32>>,
    /// Where the partitions taken last started, until their first reads confirm it.
    starts: runner::Starts,
    /// Whether another process was seen using this replica's name.
    namesake: bool,
}

impl KafkaQueue {
    /// Reads jobs from this replica's partitions until `shutdown`, and stops reading
    /// while `max_in_flight` jobs are held (librdkafka's read-ahead is bounded by
    /// `queued.max.messages.kbytes`); every second, writes a heartbeat and takes or gives
    /// up partitions as replicas come and go.
    pub(super) async fn read(self, shutdown: CancellationToken) {
        let inner = &self.inner;
        let held = ::metrics::gauge!(crate::metrics::KAFKA_QUEUE_HELD);
        let mut owned = Ownership::default();
        let mut tick = tokio::time::interval(HEARTBEAT);
        let mut room = true;
        loop {
            let message = tokio::select! {
                m = super::client::next(&inner.jobs, &inner.settings.jobs, &shutdown), if room => match m {
                    Some(m) => m,
                    None => continue, // shutting down: the branch below ends the loop
                },
                _ = inner.room.notified(), if !room => {
                    room = self.pending().held() < inner.settings.max_in_flight;
                    continue;
                }
                _ = tick.tick() => {
                    self.beat(false);
                    self.rebalance(&mut owned).await;
                    room = self.pending().held() < inner.settings.max_in_flight;
                    continue;
                }
                _ = shutdown.cancelled() => {
                    self.beat(true);
                    let producer = inner.producer.clone();
                    let _ = tokio::task::spawn_blocking(move || producer.flush(Duration::from_secs(2))).await;
                    return;
                }
            };
            let (partition, offset) = (message.partition(), message.offset());
            match owned.starts.check(partition, offset) {
                Take::Keep => {}
                Take::Skip => continue,
                Take::Rewind(to) => {
                    tracing::info!(
                        partition,
                        from = offset,
                        to,
                        "kafka queue: the read skipped past the committed offset; reading from earlier"
                    );
                    // Asynchronous (no timeout): messages fetched before it are dropped.
                    if let Err(e) = inner
                        .jobs
                        .seek(&inner.settings.jobs, partition, Offset::Offset(to), Duration::ZERO)
                    {
                        tracing::warn!(partition, error = %e, "kafka queue: cannot read the partition from earlier");
                    }
                    continue;
                }
            }
            let body = Bytes::copy_from_slice(message.payload().unwrap_or_default());
            let count = {
                let mut pending = self.pending();
                match records::read::<JobMeta, _>(message.headers()) {
                    Some(meta) => pending.add(Held {
                        meta,
                        body,
                        attempts: 0,
                        not_before: 0,
                        partition,
                        offset,
                    }),
                    None => {
                        tracing::warn!(partition, offset, "kafka queue: a message that is not a job is skipped");
                        pending.read(partition, offset);
                        pending.release(partition, offset);
                    }
                }
                pending.held()
            };
            held.set(count as f64);
            inner.wake.notify_one();
            room = count < inner.settings.max_in_flight;
        }
    }

    /// Writes this replica's heartbeat (not waited for).
    fn beat(&self, leaving: bool) {
        let replica = self.inner.replica.clone();
        let key = format!("member:{replica}");
        let member = Member {
            replica,
            instance: self.inner.instance,
            leaving,
        };
        let _ = self.send(&Out::state(&Record::Member(member), &key, Bytes::new()));
    }

    /// Gives up the partitions that now belong to another replica (their finished
    /// prefix committed first), and takes the ones that belong here once that has held
    /// for two looks in a row (so the replica giving them up has let go), after catching
    /// the view up: a job whose result was written before is then seen as done.
    async fn rebalance(&self, owned: &mut Ownership) {
        let inner = &self.inner;
        let timeout = i64::try_from(inner.settings.member_timeout.as_millis()).unwrap_or(i64::MAX);
        let now = crate::queue::now_ms();
        let namesake = inner.view.namesake(&inner.replica, inner.instance, inner.started);
        if namesake && !owned.namesake {
            tracing::error!(replica = %inner.replica,
                "kafka queue: another running replica has this replica's name; give each a distinct kafka.queue.replica \
                 (until then both read the same partitions and may run jobs twice)");
        }
        owned.namesake = namesake;
        let live = inner.view.live(now, timeout);
        let want = runner::owned(&live, &inner.replica, inner.job_partitions);
        let topic = &inner.settings.jobs;
        let lost: Vec<i32> = owned.now.iter().copied().filter(|p| !want.contains(p)).collect();
        if !lost.is_empty() {
            let commits = self.pending().revoke(&lost);
            if !commits.is_empty() {
                if let Err(e) = inner.jobs.commit(&runner::offsets(topic, &commits), CommitMode::Sync) {
                    tracing::warn!(error = %e, "kafka queue: offsets not committed on hand-over; those jobs are checked again");
                }
            }
            let _ = inner.jobs.incremental_unassign(&runner::offsets(
                topic,
                &lost.iter().map(|p| (*p, 0)).collect::<Vec<_>>(),
            ));
            owned.now.retain(|p| want.contains(p));
            lost.iter().for_each(|p| owned.starts.end(*p));
            tracing::info!(partitions = ?lost, "kafka queue: partitions of the jobs topic moved away");
            tracing::info!(partitions = ?owned.now, "kafka queue: partitions of the jobs topic assigned");
        }
        let gained: Vec<i32> = want.iter().copied().filter(|p| !owned.now.contains(p)).collect();
        if gained.is_empty() || owned.pending.as_ref() != Some(&gained) {
            owned.pending = (!gained.is_empty()).then_some(gained);
            return;
        }
        owned.pending = None;
        if let Err(e) = inner.view.catch_up().await {
            tracing::warn!(error = %e, "kafka queue: the view did not catch up; jobs may run twice");
        }
        // Read from the committed offsets, each checked by its first read (see `Starts`).
        let mut list = rdkafka::TopicPartitionList::new();
        for p in &gained {
            list.add_partition(topic, *p);
        }
        let jobs = inner.jobs.clone();
        let committed =
            tokio::task::spawn_blocking(move || jobs.committed_offsets(list, Duration::from_secs(10))).await;
        let committed = match committed {
            Ok(Ok(list)) => list,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "kafka queue: cannot read the committed offsets; trying again at the next look");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "kafka queue: cannot read the committed offsets");
                return;
            }
        };
        let mut list = rdkafka::TopicPartitionList::new();
        for p in &gained {
            let at = match committed.find_partition(topic, *p).map(|e| e.offset()) {
                Some(Offset::Offset(n)) => n,
                _ => 0, // nothing committed yet: from the beginning
            };
            let _ = list.add_partition_offset(topic, *p, Offset::Offset(at));
            owned.starts.begin(*p, at);
        }
        if let Err(e) = inner.jobs.incremental_assign(&list) {
            tracing::warn!(error = %e, "kafka queue: cannot read partitions of the jobs topic");
            return;
        }
        owned.now.extend(gained);
        owned.now.sort_unstable();
        tracing::info!(partitions = ?owned.now, "kafka queue: partitions of the jobs topic assigned");
    }
}
