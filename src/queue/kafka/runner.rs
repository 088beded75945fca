//! The jobs this replica has read from its partitions of the jobs topic and not yet
//! finished, and which partitions it owns.
//!
//! Jobs wait per route until a worker leases them; an offset is committed only once
//! every job at or before it has a durable terminal state (or was found already done),
//! so a replica that dies leaves its unfinished jobs to the replica that owns its
//! partitions next. When partitions go to another replica, the finished prefix is
//! committed at once and the jobs not yet leased are dropped here (the new owner reads
//! them). Ownership follows the replicas' heartbeats on the state topic ([`owned`]).

use std::collections::{BTreeSet, HashMap, VecDeque};

use bytes::Bytes;
use rdkafka::{Offset, TopicPartitionList};

use super::records::JobMeta;

/// A job read from the jobs topic.
#[derive(Debug, Clone)]
pub struct Held {
    /// What was submitted.
    pub meta: JobMeta,
    /// Its body.
    pub body: Bytes,
    /// Attempts started so far.
    pub attempts: u32,
    /// Earliest next attempt (ms since the Unix epoch).
    pub not_before: i64,
    /// Where it was read.
    pub partition: i32,
    /// Its offset there.
    pub offset: i64,
}

/// Jobs read and unfinished, and the offsets they hold back.
#[derive(Debug, Default)]
pub struct Pending {
    /// Per route, jobs waiting for a worker.
    ready: HashMap<String, VecDeque<Held>>,
    /// Jobs a worker is running, by id.
    leased: HashMap<String, Held>,
    /// Per assigned partition: offsets read and not done; and one past the highest read.
    open: HashMap<i32, (BTreeSet<i64>, i64)>,
    /// Per partition, the offset last committed.
    committed: HashMap<i32, i64>,
    /// Where each held job (waiting or running) was read.
    at: HashMap<String, (i32, i64)>,
}

impl Pending {
    /// Jobs held (waiting or running).
    pub fn held(&self) -> usize {
        self.ready.values().map(VecDeque::len).sum::<usize>() + self.leased.len()
    }

    /// Takes a job just read. A job held here already is never held twice: the same
    /// message delivered again is ignored; a second copy (a resubmission under the same
    /// idempotency key) is released at once while the first holds the commit back; and
    /// a job read again after its partition came back answers for the new offset.
    pub fn add(&mut self, held: Held) {
        let here = (held.partition, held.offset);
        if let Some(&first) = self.at.get(&held.meta.id) {
            let first_open = self.open.get(&first.0).is_some_and(|(open, _)| open.contains(&first.1));
            if first_open {
                if first != here {
                    self.read(held.partition, held.offset);
                    self.release(held.partition, held.offset);
                }
                return;
            }
            self.read(held.partition, held.offset);
            self.at.insert(held.meta.id.clone(), here);
            let id = &held.meta.id;
            let waiting = self.ready.values_mut().flatten().find(|j| &j.meta.id == id);
            if let Some(job) = self.leased.get_mut(id).or(waiting) {
                (job.partition, job.offset) = here;
            }
            return;
        }
        self.read(held.partition, held.offset);
        self.at.insert(held.meta.id.clone(), here);
        self.ready.entry(held.meta.route.clone()).or_default().push_back(held);
    }

    /// Notes an offset read (a job, or a message that is not one).
    pub fn read(&mut self, partition: i32, offset: i64) {
        let (open, next) = self.open.entry(partition).or_default();
        open.insert(offset);
        *next = (*next).max(offset + 1);
    }

    /// Routes with a job ready at `now`.
    pub fn routes(&self, now: i64) -> Vec<String> {
        self.ready
            .iter()
            .filter(|(_, jobs)| jobs.iter().any(|j| j.not_before <= now))
            .map(|(route, _)| route.clone())
            .collect()
    }

    /// Leases up to `max` of `route`'s jobs ready at `now`, oldest first.
    pub fn take(&mut self, route: &str, max: usize, now: i64) -> Vec<Held> {
        let Some(jobs) = self.ready.get_mut(route) else {
            return Vec::new();
        };
        let mut taken = Vec::new();
        let mut later = VecDeque::new();
        while taken.len() < max {
            let Some(job) = jobs.pop_front() else { break };
            match job.not_before <= now {
                true => taken.push(job),
                false => later.push_back(job),
            }
        }
        later.append(jobs);
        *jobs = later;
        if jobs.is_empty() {
            self.ready.remove(route);
        }
        for job in &taken {
            self.leased.insert(job.meta.id.clone(), job.clone());
        }
        taken
    }

    /// The leased job `id`.
    pub fn leased(&self, id: &str) -> Option<&Held> {
        self.leased.get(id)
    }

    /// Job `id` is done (a terminal state is durable, or it was found done): its offset
    /// no longer holds the commit back.
    pub fn done(&mut self, id: &str) {
        if let Some(job) = self.leased.remove(id) {
            self.at.remove(id);
            self.release(job.partition, job.offset);
        }
    }

    /// Offset `offset` of `partition` no longer holds the commit back.
    pub fn release(&mut self, partition: i32, offset: i64) {
        if let Some((open, _)) = self.open.get_mut(&partition) {
            open.remove(&offset);
        }
    }

    /// Puts leased job `id` back to wait until `not_before`, with `attempts` counted.
    pub fn requeue(&mut self, id: &str, attempts: u32, not_before: i64) {
        if let Some(mut job) = self.leased.remove(id) {
            if !self.open.contains_key(&job.partition) {
                self.at.remove(id);
                return; // its partition went to another replica, which reads it again
            }
            job.attempts = attempts;
            job.not_before = not_before;
            self.ready.entry(job.meta.route.clone()).or_default().push_back(job);
        }
    }

    /// The offsets to commit now: per partition, the first still open (or one past the
    /// last read), where that moved since the last commit.
    pub fn commits(&mut self) -> Vec<(i32, i64)> {
        self.commits_of(|_| true)
    }

    fn commits_of(&mut self, which: impl Fn(i32) -> bool) -> Vec<(i32, i64)> {
        let mut out = Vec::new();
        for (partition, (open, next)) in self.open.iter().filter(|(p, _)| which(**p)) {
            let point = open.first().copied().unwrap_or(*next);
            let last = self.committed.get(partition).copied().unwrap_or(-1);
            if point > last {
                out.push((*partition, point));
            }
        }
        for (partition, point) in &out {
            self.committed.insert(*partition, *point);
        }
        out
    }

    /// `partitions` were taken away: returns what to commit for them, and forgets them
    /// and their waiting jobs (running ones finish; their results still count).
    pub fn revoke(&mut self, partitions: &[i32]) -> Vec<(i32, i64)> {
        let commits = self.commits_of(|p| partitions.contains(&p));
        for p in partitions {
            self.open.remove(p);
            self.committed.remove(p);
        }
        for jobs in self.ready.values_mut() {
            for gone in jobs.iter().filter(|j| partitions.contains(&j.partition)) {
                self.at.remove(&gone.meta.id);
            }
            jobs.retain(|j| !partitions.contains(&j.partition));
        }
        self.ready.retain(|_, jobs| !jobs.is_empty());
        commits
    }
}

/// Where reading each newly taken partition starts, and the check that it did.
///
/// A partition is read from its committed offset, which may lie inside a record batch.
/// Kafka then returns the whole batch (the client drops the records before the offset);
/// tansu 0.6 returns the *next* batch, so the rest of this one would be skipped, jobs
/// with it. So the first message read must not lie past the committed offset; when it
/// does, reading goes back further (1, 2, 4... offsets before it) until one does, and
/// messages before the committed offset (done already) are skipped.
///
/// A partition given up is forgotten, and its messages are skipped from then on: the
/// client may still hand over some fetched before it let go, and taking one would let
/// this replica commit offsets of a partition another replica now reads, past jobs that
/// replica has not finished (lost if it then dies).
#[derive(Debug, Default)]
pub struct Starts(HashMap<i32, Start>);

#[derive(Debug, Clone, Copy)]
struct Start {
    committed: i64,
    tried: i64,
    confirmed: bool,
}

/// What to do with a message read from a partition being started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// Take it as a job.
    Keep,
    /// Before the committed offset (done already), or of a partition not read here.
    Skip,
    /// The read skipped past the committed offset: read again from this offset.
    Rewind(i64),
}

impl Starts {
    /// `partition` is read from `committed` on.
    pub fn begin(&mut self, partition: i32, committed: i64) {
        let committed = committed.max(0);
        self.0.insert(
            partition,
            Start {
                committed,
                tried: committed,
                confirmed: false,
            },
        );
    }

    /// `partition` was given up.
    pub fn end(&mut self, partition: i32) {
        self.0.remove(&partition);
    }

    /// What to do with the message at `offset` of `partition`.
    pub fn check(&mut self, partition: i32, offset: i64) -> Take {
        let Some(start) = self.0.get_mut(&partition) else {
            return Take::Skip; // not this replica's (any more)
        };
        if !start.confirmed {
            if offset > start.committed && start.tried > 0 {
                let back = (start.committed - start.tried).max(0);
                start.tried = (start.committed - if back == 0 { 1 } else { back * 2 }).max(0);
                return Take::Rewind(start.tried);
            }
            start.confirmed = true;
        }
        match offset < start.committed {
            true => Take::Skip,
            false => Take::Keep,
        }
    }
}

/// The list of `offset`s (per partition) on `topic`.
pub fn offsets(topic: &str, commits: &[(i32, i64)]) -> TopicPartitionList {
    let mut list = TopicPartitionList::new();
    for (partition, offset) in commits {
        // Adding a partition to a fresh list cannot fail.
        let _ = list.add_partition_offset(topic, *partition, Offset::Offset(*offset));
    }
    list
}

/// The partitions of `count` that replica `me` owns when `live` replicas share them:
/// the live names sorted, partition `p` to the `p mod n`-th. Every replica computes
/// the same split from the same heartbeats.
pub fn owned(live: &[String], me: &str, count: i32) -> Vec<i32> {
    let mut names: Vec<&str> = live.iter().map(String::as_str).collect();
    if !names.contains(&me) {
        names.push(me);
    }
    names.sort_unstable();
    names.dedup();
    let Some(index) = names.iter().position(|n| *n == me) else {
        return Vec::new();
    };
    (0..count).filter(|p| *p as usize % names.len() == index).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(id: &str, route: &str, partition: i32, offset: i64) -> Held {
        Held {
            meta: JobMeta {
                id: id.into(),
                route: route.into(),
                method: "POST".into(),
                path: "/".into(),
                headers: Vec::new(),
                created_at: 0,
                expires_at: i64::MAX,
                idempotency_key: None,
                batch: None,
                tenant: String::new(),
                shadow: false,
            },
            body: Bytes::new(),
            attempts: 0,
            not_before: 0,
            partition,
            offset,
        }
    }

    #[test]
    fn a_start_inside_a_batch_that_reads_past_it_goes_back_until_it_does_not() {
        let mut starts = Starts::default();
        starts.begin(0, 69);
        // The broker answered the read at 69 with the next batch, at 70.
        assert_eq!(starts.check(0, 70), Take::Rewind(68));
        assert_eq!(
            starts.check(0, 70),
            Take::Rewind(67),
            "a message read before the rewind"
        );
        assert_eq!(starts.check(0, 70), Take::Rewind(65));
        assert_eq!(starts.check(0, 63), Take::Skip, "the batch holding 65 starts at 63");
        assert_eq!(starts.check(0, 64), Take::Skip);
        assert_eq!(
            starts.check(0, 69),
            Take::Keep,
            "the job at the committed offset is read"
        );
        assert_eq!(starts.check(0, 70), Take::Keep);
        assert_eq!(starts.check(1, 5), Take::Skip, "a partition never taken");

        starts.begin(2, 10);
        assert_eq!(starts.check(2, 10), Take::Keep, "a read that starts where it should");
        starts.begin(3, 3);
        for back in [2, 1, 0] {
            assert_eq!(starts.check(3, 9), Take::Rewind(back));
        }
        assert_eq!(
            starts.check(3, 9),
            Take::Keep,
            "nothing before 0: what is there is read"
        );
        starts.end(0);
        assert_eq!(
            starts.check(0, 71),
            Take::Skip,
            "given up: a message fetched before is left to the new owner"
        );
    }

    #[test]
    fn an_offset_is_committed_only_past_jobs_that_are_done() {
        let mut p = Pending::default();
        for (i, id) in ["a", "b", "c"].iter().enumerate() {
            p.add(held(id, "r", 0, i as i64));
        }
        let taken = p.take("r", 10, 0);
        assert_eq!(taken.len(), 3);
        assert_eq!(p.commits(), vec![(0, 0)], "nothing done: the commit stays at the first");
        p.done("b");
        assert!(p.commits().is_empty(), "a is still open");
        p.done("a");
        assert_eq!(p.commits(), vec![(0, 2)]);
        p.done("c");
        assert_eq!(p.commits(), vec![(0, 3)]);
        assert_eq!(p.held(), 0);
    }

    #[test]
    fn a_retry_waits_and_a_revoked_partition_is_forgotten() {
        let mut p = Pending::default();
        p.add(held("a", "r", 0, 0));
        p.add(held("b", "r", 1, 0));
        assert_eq!(p.take("r", 1, 0).len(), 1);
        p.requeue("a", 1, 100);
        assert_eq!(p.routes(50), vec!["r".to_owned()], "b is ready");
        let ids: Vec<String> = p.take("r", 10, 50).into_iter().map(|h| h.meta.id).collect();
        assert_eq!(ids, ["b"], "a waits until 100");
        assert_eq!(p.revoke(&[0]), vec![(0, 0)]);
        assert!(p.routes(1000).is_empty(), "a went with its partition");
        p.done("b");
        assert_eq!(p.commits(), vec![(1, 1)]);
    }

    #[test]
    fn a_job_delivered_twice_or_submitted_twice_is_held_once() {
        let mut p = Pending::default();
        p.add(held("a", "r", 0, 0));
        p.add(held("a", "r", 0, 0)); // the same message again
        p.add(held("a", "r", 0, 1)); // a second copy of the job
        assert_eq!(p.held(), 1);
        assert_eq!(p.take("r", 10, 0).len(), 1);
        assert_eq!(p.commits(), vec![(0, 0)]);
        p.done("a");
        assert_eq!(p.commits(), vec![(0, 2)], "both copies are done");
    }

    #[test]
    fn live_replicas_split_the_partitions_alike_and_whole() {
        let live = ["b".to_owned(), "a".to_owned(), "c".to_owned()];
        let (a, b, c) = (owned(&live, "a", 8), owned(&live, "b", 8), owned(&live, "c", 8));
        assert_eq!((a.clone(), b, c), (vec![0, 3, 6], vec![1, 4, 7], vec![2, 5]));
        assert_eq!(owned(&live[1..2], "a", 4), vec![0, 1, 2, 3], "alone, a owns all");
        assert_eq!(owned(&["b".to_owned()], "a", 4), vec![0, 2], "a counts itself");
    }

    #[test]
    fn a_job_read_again_while_it_runs_is_not_run_twice() {
        let mut p = Pending::default();
        p.add(held("a", "r", 0, 5));
        assert_eq!(p.take("r", 10, 0).len(), 1);
        p.revoke(&[0]);
        p.add(held("a", "r", 0, 5)); // the partition came back; a is read again
        assert!(p.take("r", 10, 0).is_empty(), "a is still running");
        p.done("a");
        assert_eq!(p.commits(), vec![(0, 6)], "its run released the new read");
    }
}
