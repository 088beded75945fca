//! SVG plots for `--plot DIR`: latency over time (p50 and p99 of each second of intended
//! send time) and the latency distribution by percentile, one colour per target. Text is
//! plain SVG `<text>`, so no fonts are needed to draw.

use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::compare::Report;
use crate::summary::Summary;

const SIZE: (u32, u32) = (960, 540);
const COLORS: [RGBColor; 6] = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
/// File name of the latency-over-time plot.
pub const OVER_TIME: &str = "latency_over_time.svg";
/// File name of the percentile distribution plot.
pub const DISTRIBUTION: &str = "latency_distribution.svg";

/// Plots one run into `dir`.
pub fn summary(dir: &Path, summary: &Summary) -> anyhow::Result<()> {
    draw(dir, &[(summary.label.as_deref().unwrap_or("run"), summary)])
}

/// Plots every target of a comparison into `dir`, on shared axes.
pub fn report(dir: &Path, report: &Report) -> anyhow::Result<()> {
    let lines: Vec<_> = report.targets.iter().map(|t| (t.name.as_str(), &t.summary)).collect();
    draw(dir, &lines)
}

/// File name of the time-to-first-token-over-time plot.
pub const TTFT_OVER_TIME: &str = "ttft_over_time.svg";

/// Plots a streams run's time to first token per second (p50 dashed, p99 solid) into `dir`.
pub fn ttft(dir: &Path, label: &str, seconds: &[crate::streams::Second]) -> anyhow::Result<()> {
    let path = dir.join(TTFT_OVER_TIME);
    let root = SVGBackend::new(&path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let answered = || seconds.iter().filter(|s| s.count > 0);
    let top = answered().map(|s| s.p99_ms).fold(0.001, f64::max) * 1.1;
    let width = seconds.len().max(1) as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("Time to first token per second: {label}"), ("sans-serif", 20))
        .margin(12)
        .margin_right(36)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..width, 0f64..top)?;
    chart
        .configure_mesh()
        .x_desc("second (streams by when they were due)")
        .y_desc("time to first token (ms)")
        .draw()?;
    let color = COLORS[0];
    let p50 = answered().map(|s| (s.second as f64 + 0.5, s.p50_ms));
    let p99 = answered().map(|s| (s.second as f64 + 0.5, s.p99_ms));
    chart
        .draw_series(DashedLineSeries::new(p50, 6, 4, color.stroke_width(1)))?
        .label("p50")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(1)));
    chart
        .draw_series(LineSeries::new(p99, color.stroke_width(2)))?
        .label("p99")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    legend(&mut chart)?;
    root.present()?;
    Ok(())
}

fn draw(dir: &Path, lines: &[(&str, &Summary)]) -> anyhow::Result<()> {
    over_time(&dir.join(OVER_TIME), lines)?;
    distribution(&dir.join(DISTRIBUTION), lines)
}

fn over_time(path: &Path, lines: &[(&str, &Summary)]) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let seconds = lines.iter().map(|(_, s)| s.series.len()).max().unwrap_or(0).max(1);
    let top = lines
        .iter()
        .flat_map(|(_, s)| &s.series)
        .map(|p| p.p99_ms)
        .fold(0.001, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption("Latency per second (from intended send time)", ("sans-serif", 20))
        .margin(12)
        .margin_right(36)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..seconds as f64, 0f64..top)?;
    chart
        .configure_mesh()
        .x_desc("second of measured time")
        .y_desc("latency (ms)")
        .draw()?;
    for (i, (name, s)) in lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let answered = || s.series.iter().filter(|p| p.count > 0);
        // Each point sits in the middle of its second.
        let p50 = answered().map(|p| (p.second as f64 + 0.5, p.p50_ms));
        let p99 = answered().map(|p| (p.second as f64 + 0.5, p.p99_ms));
        chart
            .draw_series(DashedLineSeries::new(p50, 6, 4, color.stroke_width(1)))?
            .label(format!("{name} p50"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(1)));
        chart
            .draw_series(LineSeries::new(p99, color.stroke_width(2)))?
            .label(format!("{name} p99"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    legend(&mut chart)?;
    root.present()?;
    Ok(())
}

fn distribution(path: &Path, lines: &[(&str, &Summary)]) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let points = |s: &Summary| -> Vec<(f64, f64)> {
        // x = -log10(1 - q): 1 at p90, 2 at p99, 3 at p99.9, so the tail gets the room.
        s.latency_distribution
            .iter()
            .map(|q| (-(1.0 - q.percentile / 100.0).log10(), q.ms))
            .collect()
    };
    let top = lines
        .iter()
        .flat_map(|(_, s)| &s.latency_distribution)
        .map(|q| q.ms)
        .fold(0.001, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption("Latency by percentile", ("sans-serif", 20))
        .margin(12)
        .margin_right(36)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..4f64, 0f64..top)?;
    chart
        .configure_mesh()
        .x_labels(5)
        .x_label_formatter(&|x| format!("{}%", (1e4 * (100.0 - 100.0 * 10f64.powf(-x))).round() / 1e4))
        .x_desc("percentile")
        .y_desc("latency (ms)")
        .draw()?;
    for (i, (name, s)) in lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(points(s), color.stroke_width(2)))?
            .label(name.to_string())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    legend(&mut chart)?;
    root.present()?;
    Ok(())
}

/// A chart on f64 axes in an SVG file.
type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

fn legend<'a>(chart: &mut Chart<'a, 'a>) -> anyhow::Result<()> {
    // Upper left: latency curves rise to the right, so that corner stays clear.
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::record::{Outcome, Recording, Reply};
    use crate::summary::Meta;

    #[test]
    fn writes_both_svgs_with_legends() -> anyhow::Result<()> {
        let start = Instant::now();
        let mut rec = Recording::new(start, Duration::from_secs(3));
        for ms in 0..3000u64 {
            let intended = start + Duration::from_millis(ms);
            let done = intended + Duration::from_micros(100 + ms % 900);
            let result = Ok(Reply {
                status: 200,
                tier: "realtime".into(),
            });
            rec.record(Outcome {
                intended,
                started: intended,
                done,
                result,
            });
        }
        let meta = Meta {
            label: Some("plotted".into()),
            url: "http://127.0.0.1:1".into(),
            model: "m".into(),
            schedule: "constant 1000/s".into(),
            warmup: Duration::ZERO,
            budget_ms: None,
        };
        let dir = tempfile::tempdir()?;
        summary(dir.path(), &Summary::new(&meta, &rec))?;
        let over_time = std::fs::read_to_string(dir.path().join(OVER_TIME))?;
        assert!(
            over_time.starts_with("<svg") && over_time.contains("plotted p99"),
            "{over_time}"
        );
        let distribution = std::fs::read_to_string(dir.path().join(DISTRIBUTION))?;
        assert!(distribution.contains("99.9%") && distribution.contains("plotted"));
        Ok(())
    }
}
