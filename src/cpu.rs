//! Where and how urgently the gateway's threads run: CPU sets and nice values.
//!
//! The doors and the real-time tier run on the main runtime's threads; the micro-batch
//! tier, the offline workers and the store's writer run on threads of their own
//! (`threads.batch_workers`). On a busy machine the batch threads can be kept off the
//! real-time threads' CPUs (`threads.realtime_cpus`, `threads.batch_cpus`), or yield
//! to them by running at a higher nice value (`threads.batch_nice`).

use std::fmt;

use serde::Deserialize;

/// The most CPUs a list may name (the kernel's usual `CPU_SETSIZE`).
const MAX_CPUS: usize = 1024;

/// A set of CPUs, written as a Linux CPU list (`"0"`, `"0-3,8"`); empty means no
/// placement (the operating system's choice).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct CpuList(Vec<usize>);

impl TryFrom<String> for CpuList {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        CpuList::parse(&text)
    }
}

impl CpuList {
    /// Parses a CPU list: items separated by commas, each a CPU number or a range
    /// `first-last`; blank is the empty list.
    pub fn parse(text: &str) -> Result<CpuList, String> {
        let mut cpus = Vec::new();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let number = |n: &str| {
                n.trim().parse::<usize>().ok().filter(|&n| n < MAX_CPUS).ok_or_else(|| {
                    format!(
                        "`{item}` in the CPU list `{text}` is not a CPU number from 0 to {}: write CPUs as `0-3,8`",
                        MAX_CPUS - 1
                    )
                })
            };
            let (first, last) = match item.split_once('-') {
                Some((a, b)) => (number(a)?, number(b)?),
                None => (number(item)?, number(item)?),
            };
            if first > last {
                return Err(format!("the range `{item}` in the CPU list `{text}` runs backwards"));
            }
            cpus.extend(first..=last);
        }
        cpus.sort_unstable();
        cpus.dedup();
        Ok(CpuList(cpus))
    }

    /// Whether the list names no CPU (threads stay where the operating system puts them).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many CPUs the list names.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Checks that this process may run on every CPU in the list (those its main
    /// thread, which is never pinned, may use); `setting` names it in the error. Always
    /// passes for the empty list, and off Linux.
    pub fn check(&self, setting: &str) -> Result<(), String> {
        #[cfg(target_os = "linux")]
        if !self.is_empty() {
            let allowed = rustix::thread::sched_getaffinity(Some(rustix::process::getpid()))
                .map_err(|e| format!("cannot read which CPUs this process may use, for {setting}: {e}"))?;
            let allowed = CpuList((0..MAX_CPUS).filter(|&c| allowed.is_set(c)).collect());
            if let Some(cpu) = self.0.iter().find(|c| !allowed.0.contains(c)) {
                return Err(format!(
                    "{setting} = \"{self}\" names CPU {cpu}, which this process may not use (it may use {allowed})"
                ));
            }
        }
        let _ = setting;
        Ok(())
    }

    /// Keeps the calling thread on these CPUs; nothing for the empty list or off Linux.
    /// A failure is logged and the thread runs on where it was.
    pub fn pin_this_thread(&self) {
        #[cfg(target_os = "linux")]
        if !self.is_empty() {
            let mut set = rustix::thread::CpuSet::new();
            for &cpu in &self.0 {
                set.set(cpu);
            }
            if let Err(e) = rustix::thread::sched_setaffinity(None, &set) {
                tracing::warn!(cpus = %self, error = %e, "cannot keep a thread on its CPUs; it runs anywhere");
            }
        }
    }
}

impl fmt::Display for CpuList {
    /// Writes the list back in its shortest form (`0-3,8`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut i = 0;
        while i < self.0.len() {
            let sep = if i == 0 { "" } else { "," };
            let first = self.0[i];
            let mut last = first;
            while i + 1 < self.0.len() && self.0[i + 1] == last + 1 {
                i += 1;
                last = self.0[i];
            }
            match first == last {
                true => write!(f, "{sep}{first}")?,
                false => write!(f, "{sep}{first}-{last}")?,
            }
            i += 1;
        }
        Ok(())
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_and_print_back_in_short_form() {
        for (text, cpus, shown) in [
            ("", vec![], ""),
            ("1", vec![1], "1"),
            ("0-3,8", vec![0, 1, 2, 3, 8], "0-3,8"),
            (" 3, 1 ,2,2 ", vec![1, 2, 3], "1-3"),
            ("0,2-2,4-5", vec![0, 2, 4, 5], "0,2,4-5"),
        ] {
            let list = CpuList::parse(text).expect(text);
            assert_eq!(list.0, cpus, "{text}");
            assert_eq!(list.to_string(), shown, "{text}");
        }
    }

    #[test]
    fn bad_cpu_lists_say_what_to_fix() {
        for (text, says) in [
            ("a", "`a` in the CPU list `a` is not a CPU number"),
            ("3-1", "the range `3-1` in the CPU list `3-1` runs backwards"),
            ("0-", "`0-` in the CPU list `0-` is not a CPU number"),
            ("1024", "from 0 to 1023"),
            ("-1", "is not a CPU number"),
        ] {
            let e = CpuList::parse(text).expect_err(text);
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[cfg(target_os = "linux")]
    fn cpus_of_this_thread() -> CpuList {
        let set = rustix::thread::sched_getaffinity(None).expect("getaffinity");
        CpuList((0..MAX_CPUS).filter(|&c| set.is_set(c)).collect())
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn pins_only_the_calling_thread_to_cpus_it_may_use() {
        let mine = cpus_of_this_thread();
        let one = CpuList(vec![*mine.0.last().expect("some CPU")]);
        one.check("threads.batch_cpus").expect("an allowed CPU passes");
        let pinned = std::thread::spawn({
            let one = one.clone();
            move || {
                one.pin_this_thread();
                cpus_of_this_thread()
            }
        })
        .join()
        .expect("thread ran");
        assert_eq!(pinned, one);
        assert_eq!(cpus_of_this_thread(), mine, "the test's own thread stays where it was");
        let e = CpuList(vec![MAX_CPUS - 1])
            .check("threads.batch_cpus")
            .expect_err("a CPU the process may not use is refused");
        assert!(e.contains("threads.batch_cpus = \"1023\" names CPU 1023"), "{e}");
    }

    #[cfg(target_os = "linux")]
    fn nice_of_this_thread() -> i32 {
        rustix::process::getpriority_process(Some(rustix::thread::gettid())).expect("getpriority")
    }

    #[cfg(target_os = "linux")]
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
