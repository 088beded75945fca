//! Open-loop schedules: the intended send time of the i-th request, computed from the
//! rate function alone. The generator asks `offset(i)` and sends request `i` at
//! `start + offset(i)` whatever happened to earlier requests, so a slow server cannot
//! slow the load down (no coordinated omission).

use std::fmt;
use std::time::Duration;

use anyhow::{bail, ensure, Context as _};

const NANOS_PER_SEC: f64 = 1e9;

/// A rate function over time, in requests per second.
#[derive(Clone, Debug, PartialEq)]
pub enum Schedule {
    /// `rate` requests per second, evenly spaced: request `i` at `i / rate` seconds.
    Constant {
        /// Requests per second, finite and > 0.
        rate: f64,
    },
    /// `base` requests per second, except during `length` at the start of every
    /// `every`-long period, when it is `peak` (the first burst starts at 0).
    Burst {
        /// Rate between bursts, finite and >= 0.
        base: f64,
        /// Rate during a burst, finite and > 0.
        peak: f64,
        /// Period of the bursts, > 0.
        every: Duration,
        /// Length of each burst, > 0 and <= `every`.
        length: Duration,
    },
    /// Steps of a constant rate each, one after the other; the last one's rate goes on
    /// past its end.
    Steps(Vec<Step>),
}

/// One step of a [`Schedule::Steps`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Step {
    /// How long it lasts, > 0.
    pub length: Duration,
    /// Its rate, finite and > 0.
    pub rate: f64,
}

impl Schedule {
    /// Parses `constant` or `burst:peak=X,every=Ns,for=Ms` (durations in humantime
    /// form), with `rate` as the constant or base rate; rejects rates or periods that
    /// would never send, or never stop sending.
    pub fn parse(spec: &str, rate: f64) -> anyhow::Result<Self> {
        let schedule = match spec.split_once(':') {
            None if spec == "constant" => Self::Constant { rate },
            Some(("burst", params)) => parse_burst(params, rate)?,
            Some(("steps", params)) => parse_steps(params)?,
            _ => {
                bail!("schedule {spec:?}: expected `constant`, `burst:peak=X,every=Ns,for=Ms` or `steps:Ns@X,Ms@Y,...`")
            }
        };
        schedule.validate()?;
        Ok(schedule)
    }

    /// The intended send time of request `i`, from the start of the schedule, rounded to
    /// the nanosecond. Strictly increasing in `i`.
    pub fn offset(&self, i: u64) -> Duration {
        let i = i as f64;
        if let Self::Steps(steps) = self {
            return steps_offset(steps, i);
        }
        match *self {
            Self::Constant { rate } => nanos(i * NANOS_PER_SEC / rate),
            Self::Burst {
                base,
                peak,
                every,
                length,
            } => {
                let in_burst = peak * length.as_secs_f64();
                let per_period = in_burst + base * (every - length).as_secs_f64();
                let period = (i / per_period).floor();
                let rem = i - period * per_period;
                let period_start = every.as_nanos() as f64 * period;
                let within = if rem < in_burst || base == 0.0 {
                    rem * NANOS_PER_SEC / peak
                } else {
                    length.as_nanos() as f64 + (rem - in_burst) * NANOS_PER_SEC / base
                };
                nanos(period_start + within)
            }
            Self::Steps(_) => unreachable!("handled above"),
        }
    }

    /// The expected number of requests intended before `t`: the integral of the rate.
    #[cfg(test)]
    pub fn cumulative(&self, t: Duration) -> f64 {
        if let Self::Steps(steps) = self {
            let (mut total, mut start) = (0.0, Duration::ZERO);
            for (n, step) in steps.iter().enumerate() {
                let end = start + step.length;
                let last = n + 1 == steps.len();
                let upto = if last { t } else { t.min(end) };
                total += upto.saturating_sub(start).as_secs_f64() * step.rate;
                start = end;
            }
            return total;
        }
        match *self {
            Self::Constant { rate } => rate * t.as_secs_f64(),
            Self::Burst {
                base,
                peak,
                every,
                length,
            } => {
                let periods = (t.as_nanos() / every.as_nanos()) as f64;
                let into = Duration::from_nanos((t.as_nanos() % every.as_nanos()) as u64);
                let per_period = peak * length.as_secs_f64() + base * (every - length).as_secs_f64();
                let burst_part = into.min(length).as_secs_f64() * peak;
                let base_part = into.saturating_sub(length).as_secs_f64() * base;
                periods * per_period + burst_part + base_part
            }
            Self::Steps(_) => unreachable!("handled above"),
        }
    }

    fn validate(&self) -> anyhow::Result<()> {
        let positive = |r: f64| r.is_finite() && r > 0.0;
        if let Self::Steps(steps) = self {
            ensure!(!steps.is_empty(), "steps: give at least one LENGTH@RATE");
            for step in steps {
                ensure!(positive(step.rate), "a step's rate must be > 0, got {}", step.rate);
                ensure!(!step.length.is_zero(), "a step's length must be > 0");
            }
            return Ok(());
        }
        match *self {
            Self::Constant { rate } => ensure!(positive(rate), "--rate must be > 0, got {rate}"),
            Self::Burst {
                base,
                peak,
                every,
                length,
            } => {
                ensure!(base.is_finite() && base >= 0.0, "--rate must be >= 0, got {base}");
                ensure!(positive(peak), "burst peak must be > 0, got {peak}");
                ensure!(!length.is_zero(), "burst `for` must be > 0");
                ensure!(
                    length <= every,
                    "burst `for` ({length:?}) must be <= `every` ({every:?})"
                );
            }
            Self::Steps(_) => {}
        }
        Ok(())
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Constant { rate } => write!(f, "constant {rate}/s"),
            Self::Burst {
                base,
                peak,
                every,
                length,
            } => write!(
                f,
                "burst {base}/s, {peak}/s for {} every {}",
                humantime::format_duration(*length),
                humantime::format_duration(*every)
            ),
            Self::Steps(steps) => {
                let steps: Vec<String> = steps
                    .iter()
                    .map(|s| format!("{}/s for {}", s.rate, humantime::format_duration(s.length)))
                    .collect();
                write!(f, "steps {}", steps.join(", then "))
            }
        }
    }
}

fn nanos(x: f64) -> Duration {
    // Rates and indices are finite and positive (validated), so `x` is too.
    Duration::from_nanos(x.round() as u64)
}

/// The intended time of request `i` (as a float) of `steps`.
fn steps_offset(steps: &[Step], i: f64) -> Duration {
    let (mut before, mut start) = (0.0, 0.0);
    for (n, step) in steps.iter().enumerate() {
        let count = step.rate * step.length.as_secs_f64();
        if i < before + count || n + 1 == steps.len() {
            return nanos((start + (i - before) / step.rate) * NANOS_PER_SEC);
        }
        before += count;
        start += step.length.as_secs_f64();
    }
    Duration::ZERO
}

/// `LENGTH@RATE,LENGTH@RATE,...` (lengths in humantime form).
fn parse_steps(params: &str) -> anyhow::Result<Schedule> {
    let steps = params
        .split(',')
        .map(|step| {
            let (length, rate) = step
                .split_once('@')
                .with_context(|| format!("step {step:?}: expected LENGTH@RATE, as 60s@100"))?;
            Ok(Step {
                length: humantime::parse_duration(length).with_context(|| format!("step length {length:?}"))?,
                rate: rate.parse().with_context(|| format!("step rate {rate:?}"))?,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Schedule::Steps(steps))
}

fn parse_burst(params: &str, base: f64) -> anyhow::Result<Schedule> {
    let (mut peak, mut every, mut length) = (None, None, None);
    for kv in params.split(',') {
        let (key, value) = kv
            .split_once('=')
            .with_context(|| format!("burst parameter {kv:?}: expected key=value"))?;
        let duration = || humantime::parse_duration(value).with_context(|| format!("burst {key}={value:?}"));
        match key {
            "peak" => peak = Some(value.parse::<f64>().with_context(|| format!("burst peak={value:?}"))?),
            "every" => every = Some(duration()?),
            "for" => length = Some(duration()?),
            _ => bail!("unknown burst parameter {key:?} (expected peak, every, for)"),
        }
    }
    Ok(Schedule::Burst {
        base,
        peak: peak.context("burst needs peak=X")?,
        every: every.context("burst needs every=Ns")?,
        length: length.context("burst needs for=Ms")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Number of requests whose intended time falls in `[from, to)`.
    fn count_in(s: &Schedule, from: Duration, to: Duration) -> u64 {
        (0..)
            .map(|i| s.offset(i))
            .take_while(|t| *t < to)
            .filter(|t| *t >= from)
            .count() as u64
    }

    fn assert_count_matches_rate(s: &Schedule, windows: &[(u64, u64)]) {
        for &(from_ms, to_ms) in windows {
            let (from, to) = (Duration::from_millis(from_ms), Duration::from_millis(to_ms));
            let expected = s.cumulative(to) - s.cumulative(from);
            let got = count_in(s, from, to) as f64;
            assert!(
                (got - expected).abs() <= 1.0,
                "{s}: [{from_ms}ms, {to_ms}ms) got {got}, expected {expected}"
            );
        }
    }

    #[test]
    fn steps_follow_each_rate_in_turn() -> anyhow::Result<()> {
        let s = Schedule::parse("steps:2s@10,1s@50,1s@10", 1.0)?;
        assert_eq!(s.offset(0), Duration::ZERO);
        assert_eq!(s.offset(19), Duration::from_millis(1900));
        assert_eq!(s.offset(20), Duration::from_secs(2));
        assert_eq!(s.offset(21), Duration::from_millis(2020));
        assert_eq!(s.offset(70), Duration::from_secs(3));
        // Past the last step, its rate goes on.
        assert_eq!(s.offset(90), Duration::from_secs(5));
        assert_count_matches_rate(&s, &[(0, 2000), (1500, 3500), (2000, 3000), (3000, 6000)]);
        assert!(Schedule::parse("steps:", 1.0).is_err());
        assert!(Schedule::parse("steps:1s@0", 1.0).is_err());
        assert!(Schedule::parse("steps:1s", 1.0).is_err());
        Ok(())
    }

    #[test]
    fn constant_offsets_are_exact() -> anyhow::Result<()> {
        let s = Schedule::parse("constant", 200.0)?;
        assert_eq!(s.offset(0), Duration::ZERO);
        assert_eq!(s.offset(1), Duration::from_millis(5));
        assert_eq!(s.offset(3), Duration::from_millis(15));
        assert_eq!(s.offset(200_000), Duration::from_secs(1000));
        let third = Schedule::parse("constant", 3.0)?;
        assert_eq!(third.offset(1), Duration::from_nanos(333_333_333));
        assert_eq!(third.offset(2), Duration::from_nanos(666_666_667));
        Ok(())
    }

    #[test]
    fn constant_count_is_rate_times_window() -> anyhow::Result<()> {
        for rate in [1.0, 3.0, 200.0, 977.5, 20_000.0] {
            let s = Schedule::parse("constant", rate)?;
            assert_count_matches_rate(&s, &[(0, 1000), (250, 1250), (1, 2), (333, 10_000)]);
        }
        Ok(())
    }

    #[test]
    fn burst_offsets_are_exact() -> anyhow::Result<()> {
        let s = Schedule::parse("burst:peak=1000,every=1s,for=100ms", 100.0)?;
        // 100 requests at 1 ms in the burst, then 90 at 10 ms, then the next period.
        assert_eq!(s.offset(0), Duration::ZERO);
        assert_eq!(s.offset(1), Duration::from_millis(1));
        assert_eq!(s.offset(99), Duration::from_millis(99));
        assert_eq!(s.offset(100), Duration::from_millis(100));
        assert_eq!(s.offset(101), Duration::from_millis(110));
        assert_eq!(s.offset(189), Duration::from_millis(990));
        assert_eq!(s.offset(190), Duration::from_secs(1));
        assert_eq!(s.offset(191), Duration::from_millis(1001));
        assert_eq!(s.offset(190 * 7 + 100), Duration::from_millis(7100));
        Ok(())
    }

    #[test]
    fn burst_count_is_integral_of_rate() -> anyhow::Result<()> {
        for spec in [
            "burst:peak=1000,every=1s,for=100ms",
            "burst:peak=333,every=700ms,for=70ms",
        ] {
            let s = Schedule::parse(spec, 37.0)?;
            assert_count_matches_rate(&s, &[(0, 1000), (50, 150), (90, 130), (0, 5000), (1234, 4321)]);
        }
        let only_bursts = Schedule::parse("burst:peak=500,every=1s,for=200ms", 0.0)?;
        assert_eq!(
            count_in(&only_bursts, Duration::from_millis(200), Duration::from_secs(1)),
            0
        );
        assert_count_matches_rate(&only_bursts, &[(0, 1000), (0, 3000), (100, 2100)]);
        Ok(())
    }

    #[test]
    fn offsets_strictly_increase() -> anyhow::Result<()> {
        let s = Schedule::parse("burst:peak=333,every=700ms,for=70ms", 37.0)?;
        let offsets: Vec<_> = (0..5000).map(|i| s.offset(i)).collect();
        assert!(offsets.windows(2).all(|w| w[0] < w[1]));
        Ok(())
    }

    #[test]
    fn rejects_bad_specs() {
        for (spec, rate) in [
            ("constant", 0.0),
            ("constant", f64::NAN),
            ("linear", 1.0),
            ("burst:peak=10,every=1s", 1.0),
            ("burst:peak=10,every=1s,for=2s", 1.0),
            ("burst:peak=0,every=1s,for=1s", 1.0),
            ("burst:peak=10,every=1s,for=0s", 1.0),
            ("burst:peak=10,every=1s,for=1s,jitter=2", 1.0),
            ("burst:peak=x,every=1s,for=1s", 1.0),
        ] {
            assert!(
                Schedule::parse(spec, rate).is_err(),
                "{spec} at {rate} should be rejected"
            );
        }
    }
}
