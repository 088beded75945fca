//! Comparing a candidate's answer with the primary's, output by output and row by row.
//!
//! Both answers are KServe v2 responses (JSON or Triton's binary extension). For each of
//! the primary's outputs the candidate must have one of the same name, datatype and
//! shape (else it is a shape mismatch); then every row (dimension 0) is compared:
//! exactly, within the route's tolerance (`|candidate - primary| <= atol + rtol *
//! |primary|` for every value, numpy's `allclose` with the primary as reference), and,
//! for rows of more than one value, by the index of the largest value (top-1), whether
//! the primary's top-1 is among the candidate's `top_k` largest, and the cosine of the
//! two rows (for embeddings). BYTES rows are compared exactly.

use crate::policy::ShadowSpec;
use crate::protocol::{self, Datatype, InferResponse, Reply, Tensor};

/// What comparing one pair of answers found.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Comparison {
    /// The two statuses differ (one is not a success, or they are different successes).
    pub status_mismatch: Option<(u16, u16)>,
    /// Outputs whose name, datatype or shape differ, with what differs.
    pub shape_mismatches: Vec<String>,
    /// Each compared output.
    pub outputs: Vec<OutputComparison>,
}

/// One output of one pair of answers.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OutputComparison {
    /// The output's name.
    pub name: String,
    /// Rows compared.
    pub rows: u64,
    /// Rows equal value for value.
    pub rows_exact: u64,
    /// Rows with every value within tolerance.
    pub rows_within: u64,
    /// Rows outside tolerance on which the primary also disagreed with itself (see
    /// [`discount`]): not counted against the candidate.
    pub rows_noisy: u64,
    /// The rows outside tolerance, by index.
    pub outside: Vec<u64>,
    /// Values compared (numeric outputs).
    pub values: u64,
    /// Values equal.
    pub values_exact: u64,
    /// Largest and summed absolute difference.
    pub max_abs: f64,
    /// Summed absolute difference, for the mean.
    pub sum_abs: f64,
    /// Largest relative difference (to the primary's value).
    pub max_rel: f64,
    /// Summed relative difference, for the mean.
    pub sum_rel: f64,
    /// Rows whose largest value is at the same index, of the rows with more than one.
    pub top1: Agreement,
    /// Rows whose primary top-1 is among the candidate's top k.
    pub topk: Agreement,
    /// Summed and smallest cosine similarity of rows of more than one value.
    pub cosine_sum: f64,
    /// Smallest row cosine; 1 when none was computed.
    pub cosine_min: f64,
    /// The row with the largest absolute difference: (row, value index, primary, candidate).
    pub worst: Option<(u64, u64, f64, f64)>,
    /// Values by absolute difference: equal, then up to each of [`DIFF_BOUNDS`], then
    /// beyond the last (or not a number).
    pub abs_diffs: [u64; DIFF_BUCKETS],
}

/// The upper bounds of the absolute-difference histogram's buckets between "equal" and
/// "more": one per decade.
pub const DIFF_BOUNDS: [f64; 7] = [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0];
/// Buckets of the absolute-difference histogram: equal, one per bound, more.
pub const DIFF_BUCKETS: usize = DIFF_BOUNDS.len() + 2;

/// The histogram bucket of an absolute difference.
fn diff_bucket(abs: f64) -> usize {
    if abs == 0.0 {
        return 0;
    }
    DIFF_BOUNDS
        .iter()
        .position(|bound| abs <= *bound)
        .map_or(DIFF_BUCKETS - 1, |i| i + 1)
}

/// How many of `of` rows agreed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Agreement {
    /// Rows that agreed.
    pub agreed: u64,
    /// Rows that could be compared.
    pub of: u64,
}

impl Agreement {
    fn add(&mut self, agreed: bool) {
        self.of += 1;
        self.agreed += u64::from(agreed);
    }
}

/// An answer that could not be compared (not a KServe v2 response).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable(pub String);

/// Compares `candidate` with `primary` under `spec`'s tolerance and top-k.
pub fn compare(primary: &Reply, candidate: &Reply, spec: &ShadowSpec) -> Result<Comparison, Unreadable> {
    let (p, c) = (primary.status(), candidate.status());
    if p != c || !p.is_success() {
        return Ok(Comparison {
            status_mismatch: (p != c).then_some((p.as_u16(), c.as_u16())),
            ..Comparison::default()
        });
    }
    let read = |reply: &Reply, who: &str| {
        decode(reply).map_err(|e| Unreadable(format!("the {who}'s answer is not a KServe v2 response: {e}")))
    };
    let (primary, candidate) = (read(primary, "primary")?, read(candidate, "candidate")?);
    let mut out = Comparison::default();
    for p in &primary.outputs {
        let Some(c) = candidate.outputs.iter().find(|c| c.name == p.name) else {
            out.shape_mismatches
                .push(format!("{}: missing from the candidate's answer", p.name));
            continue;
        };
        if (c.datatype, &c.shape) != (p.datatype, &p.shape) {
            out.shape_mismatches.push(format!(
                "{}: {} {} against the primary's {} {}",
                p.name,
                c.datatype.as_str(),
                protocol::fmt_shape(&c.shape),
                p.datatype.as_str(),
                protocol::fmt_shape(&p.shape)
            ));
            continue;
        }
        out.outputs.push(output(p, c, spec));
    }
    Ok(out)
}

/// Marks as noisy each row of `cmp` (candidate against primary) outside tolerance that is
/// also outside it in `noise` (the primary against itself, asked twice): a difference the
/// primary makes with itself is not held against the candidate (Diffy's noise floor).
pub fn discount(cmp: &mut Comparison, noise: &Comparison) {
    for o in &mut cmp.outputs {
        let Some(n) = noise.outputs.iter().find(|n| n.name == o.name) else {
            continue;
        };
        o.rows_noisy = o
            .outside
            .iter()
            .filter(|row| n.outside.binary_search(row).is_ok())
            .count() as u64;
    }
}

fn decode(reply: &Reply) -> Result<InferResponse, protocol::Error> {
    let header_len = protocol::header_len(reply.headers())?;
    protocol::decode_response(reply.body(), header_len)
}

fn output(p: &Tensor, c: &Tensor, spec: &ShadowSpec) -> OutputComparison {
    let rows = p.rows().max(1);
    let mut out = OutputComparison {
        name: p.name.clone(),
        cosine_min: 1.0,
        ..OutputComparison::default()
    };
    let (Some(pv), Some(cv)) = (numbers(p), numbers(c)) else {
        // BYTES: element by element, rows exactly.
        let (pe, ce): (Vec<&[u8]>, Vec<&[u8]>) = (p.bytes_elements().collect(), c.bytes_elements().collect());
        let per_row = (pe.len() as u64 / rows).max(1) as usize;
        for (row, (pr, cr)) in pe.chunks(per_row).zip(ce.chunks(per_row)).enumerate() {
            out.rows += 1;
            let same = pr == cr;
            out.rows_exact += u64::from(same);
            out.rows_within += u64::from(same);
            if !same {
                out.outside.push(row as u64);
            }
        }
        return out;
    };
    let per_row = (pv.len() as u64 / rows).max(1) as usize;
    let tolerance = spec.tolerance;
    for (row, (pr, cr)) in pv.chunks(per_row).zip(cv.chunks(per_row)).enumerate() {
        out.rows += 1;
        let (mut exact, mut within) = (true, true);
        for (i, (&a, &b)) in pr.iter().zip(cr).enumerate() {
            out.values += 1;
            let same = a == b || (a.is_nan() && b.is_nan());
            out.values_exact += u64::from(same);
            exact &= same;
            let abs = if same { 0.0 } else { (b - a).abs() };
            let rel = if same {
                0.0
            } else {
                abs / a.abs().max(f64::MIN_POSITIVE)
            };
            within &= same || abs <= tolerance.atol + tolerance.rtol * a.abs();
            out.sum_abs += abs;
            out.abs_diffs[diff_bucket(abs)] += 1;
            out.sum_rel += rel;
            out.max_rel = out.max_rel.max(rel);
            if abs > out.max_abs || (abs.is_nan() && !out.max_abs.is_nan()) {
                out.max_abs = abs;
                out.worst = Some((row as u64, i as u64, a, b));
            }
        }
        out.rows_exact += u64::from(exact);
        out.rows_within += u64::from(within);
        if !within {
            out.outside.push(row as u64);
        }
        if pr.len() > 1 {
            let top = argmax(pr);
            out.top1.add(top == argmax(cr));
            out.topk.add(top_k(cr, spec.top_k as usize).contains(&top));
            let cosine = cosine(pr, cr);
            out.cosine_sum += cosine;
            out.cosine_min = out.cosine_min.min(cosine);
        }
    }
    out
}

/// A numeric tensor's values as f64 (BOOL as 0 and 1); `None` for BYTES.
fn numbers(t: &Tensor) -> Option<Vec<f64>> {
    let d = &t.data;
    let each = |size: usize, read: &dyn Fn(&[u8]) -> f64| d.chunks_exact(size).map(read).collect();
    Some(match t.datatype {
        Datatype::Bytes => return None,
        Datatype::Bool | Datatype::Uint8 => d.iter().map(|&b| f64::from(b)).collect(),
        Datatype::Int8 => d.iter().map(|&b| f64::from(b as i8)).collect(),
        Datatype::Uint16 => each(2, &|b| f64::from(u16::from_le_bytes([b[0], b[1]]))),
        Datatype::Int16 => each(2, &|b| f64::from(i16::from_le_bytes([b[0], b[1]]))),
        Datatype::Fp16 => each(2, &|b| f16(u16::from_le_bytes([b[0], b[1]]))),
        Datatype::Bf16 => each(2, &|b| {
            f64::from(f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16))
        }),
        Datatype::Uint32 => each(4, &|b| f64::from(u32::from_le_bytes(protocol::le(b)))),
        Datatype::Int32 => each(4, &|b| f64::from(i32::from_le_bytes(protocol::le(b)))),
        Datatype::Fp32 => each(4, &|b| f64::from(f32::from_le_bytes(protocol::le(b)))),
        Datatype::Uint64 => each(8, &|b| u64::from_le_bytes(protocol::le(b)) as f64),
        Datatype::Int64 => each(8, &|b| i64::from_le_bytes(protocol::le(b)) as f64),
        Datatype::Fp64 => each(8, &|b| f64::from_le_bytes(protocol::le(b))),
    })
}

/// An IEEE 754 half-precision value.
fn f16(bits: u16) -> f64 {
    let sign = if bits & 0x8000 == 0 { 1.0 } else { -1.0 };
    let exponent = i32::from((bits >> 10) & 0x1f);
    let mantissa = f64::from(bits & 0x3ff);
    sign * match exponent {
        0 => mantissa * 2f64.powi(-24),
        31 if mantissa == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        e => (1.0 + mantissa / 1024.0) * 2f64.powi(e - 15),
    }
}

fn argmax(row: &[f64]) -> usize {
    (0..row.len()).fold(0, |best, i| if row[i] > row[best] { i } else { best })
}

/// The indexes of the `k` largest values of `row`.
fn top_k(row: &[f64], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..row.len()).collect();
    order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
    order.truncate(k);
    order
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    let (na, nb) = (norm(a), norm(b));
    if na == 0.0 || nb == 0.0 {
        return if na == nb { 1.0 } else { 0.0 };
    }
    dot / (na * nb)
}

/// The KServe v2 JSON body of an answer with these FP32 outputs, for tests.
#[cfg(test)]
pub(crate) fn answer(outputs: &[(&str, &[u64], &[f32])]) -> Reply {
    let outputs: Vec<_> = outputs
        .iter()
        .map(|(name, shape, data)| serde_json::json!({"name": name, "datatype": "FP32", "shape": shape, "data": data}))
        .collect();
    let body = serde_json::json!({"model_name": "m", "outputs": outputs});
    http::Response::new(bytes::Bytes::from(body.to_string()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn differences_fall_in_their_decade() {
        use super::diff_bucket;
        assert_eq!(diff_bucket(0.0), 0);
        assert_eq!(diff_bucket(1e-9), 1);
        assert_eq!(diff_bucket(1e-6), 1);
        assert_eq!(diff_bucket(2e-6), 2);
        assert_eq!(diff_bucket(0.5), 7);
        assert_eq!(diff_bucket(1.0), 7);
        assert_eq!(diff_bucket(3.0), 8);
        assert_eq!(diff_bucket(f64::NAN), 8);
        assert_eq!(diff_bucket(f64::INFINITY), 8);
    }

    use super::*;

    /// The shadow of a policy with these tolerances and top 2.
    pub(crate) fn spec(atol: f64, rtol: f64) -> ShadowSpec {
        let text = format!(
            "[routes.r]\nmodels = [\"m\"]\n[routes.r.realtime]\nendpoints = [\"http://h:1\"]\n\
             [routes.r.shadow]\natol = {atol:?}\nrtol = {rtol:?}\ntop_k = 2\n\
             [routes.r.shadow.candidate]\nendpoints = [\"http://c:1\"]\n"
        );
        let policy = crate::policy::Policy::from_texts(vec![("p.toml".into(), text)]).expect("valid");
        let route = policy.route("r").expect("route");
        (**route.shadow.as_ref().expect("shadow")).clone()
    }

    #[test]
    fn rows_within_tolerance_exact_and_top_k() {
        let primary = answer(&[("probs", &[3, 3], &[0.1, 0.7, 0.2, 0.5, 0.3, 0.2, 0.0, 0.0, 1.0])]);
        // Row 0 within tolerance; row 1 swaps the top two; row 2 is the same.
        let candidate = answer(&[("probs", &[3, 3], &[0.1, 0.70001, 0.2, 0.3, 0.5, 0.2, 0.0, 0.0, 1.0])]);
        let cmp = compare(&primary, &candidate, &spec(1e-3, 0.0)).expect("readable");
        assert_eq!((cmp.status_mismatch, cmp.shape_mismatches.len()), (None, 0));
        let o = &cmp.outputs[0];
        assert_eq!((o.rows, o.rows_exact, o.rows_within), (3, 1, 2));
        assert_eq!((o.values, o.values_exact), (9, 6));
        assert_eq!((o.top1.agreed, o.top1.of), (2, 3));
        assert_eq!((o.topk.agreed, o.topk.of), (3, 3), "the swap is within the top 2");
        assert!((o.max_abs - 0.2).abs() < 1e-6, "{}", o.max_abs);
        assert_eq!(o.abs_diffs.iter().sum::<u64>(), 9, "every value in one bucket");
        assert_eq!(
            (o.abs_diffs[0], o.abs_diffs[7]),
            (6, 2),
            "equal, and the swap's 0.2: {:?}",
            o.abs_diffs
        );
        let (row, index, p, c) = o.worst.expect("a worst value");
        assert_eq!((row, index), (1, 0));
        assert!((p - 0.5).abs() < 1e-6 && (c - 0.3).abs() < 1e-6);
        assert!(o.cosine_min < 1.0 && o.cosine_min > 0.8);
    }

    #[test]
    fn statuses_and_shapes_that_differ_are_counted_not_compared() {
        let primary = answer(&[("y", &[2, 1], &[1.0, 2.0])]);
        let mut failed = answer(&[]);
        *failed.status_mut() = http::StatusCode::BAD_GATEWAY;
        let cmp = compare(&primary, &failed, &spec(0.0, 0.0)).expect("readable");
        assert_eq!(cmp.status_mismatch, Some((200, 502)));
        let wider = answer(&[("y", &[1, 2], &[1.0, 2.0])]);
        let cmp = compare(&primary, &wider, &spec(0.0, 0.0)).expect("readable");
        assert_eq!(cmp.shape_mismatches, ["y: FP32 [1,2] against the primary's FP32 [2,1]"]);
        let missing = answer(&[("z", &[2, 1], &[1.0, 2.0])]);
        let cmp = compare(&primary, &missing, &spec(0.0, 0.0)).expect("readable");
        assert_eq!(cmp.shape_mismatches, ["y: missing from the candidate's answer"]);
        let junk = http::Response::new(bytes::Bytes::from_static(b"<html>"));
        assert!(compare(&primary, &junk, &spec(0.0, 0.0)).is_err());
    }

    #[test]
    fn rows_the_primary_disagrees_on_with_itself_are_noise() {
        let primary = answer(&[("y", &[3, 1], &[1.0, -2.0, 3.0])]);
        let again = answer(&[("y", &[3, 1], &[1.0, -2.5, 3.0])]);
        let candidate = answer(&[("y", &[3, 1], &[1.0, -2.7, 3.5])]);
        let mut cmp = compare(&primary, &candidate, &spec(1e-6, 0.0)).expect("readable");
        let noise = compare(&primary, &again, &spec(1e-6, 0.0)).expect("readable");
        discount(&mut cmp, &noise);
        let o = &cmp.outputs[0];
        assert_eq!(
            (o.rows, o.rows_within, o.rows_noisy, &o.outside[..]),
            (3, 1, 1, &[1, 2][..])
        );
    }

    #[test]
    fn half_precision_values() {
        assert_eq!(f16(0x3c00), 1.0);
        assert_eq!(f16(0xc000), -2.0);
        assert_eq!(f16(0x0001), 2f64.powi(-24));
        assert!(f16(0x7e00).is_nan());
    }
}
