//! One request cut into its rows, and rows' answers joined back into one: what the
//! micro-batch tier needs to look up, send once and keep each row of a batch on its own
//! (see `tiers::micro_batch::rows`). Same checks as [`super::batch`]: shapes before
//! slicing, no panics.

use super::batch::{append, row_cuts, signature, BatchError};
use super::{InferRequest, InferResponse, Tensor};

/// `req` as one request per row, in order: each input's row `i` (dimension 0 of 1,
/// zero-copy slices), the request's parameters and requested outputs, no id. A
/// one-row request asks what `req` asks of that row, so its cache key is the row's.
pub fn cut(req: &InferRequest) -> Result<Vec<InferRequest>, BatchError> {
    let (_, n) = signature(req)?;
    let ones = vec![1u64; usize::try_from(n).map_err(|_| BatchError::TooManyRows)?];
    let mut cuts = Vec::with_capacity(req.inputs.len());
    for t in &req.inputs {
        cuts.push(row_cuts(t, &ones).map_err(|problem| BatchError::BadInput {
            index: 0,
            input: t.name.clone(),
            problem,
        })?);
    }
    let row = |i: usize| InferRequest {
        id: None,
        parameters: req.parameters.clone(),
        inputs: req
            .inputs
            .iter()
            .zip(&cuts)
            .map(|(t, cut)| {
                let mut shape = t.shape.clone();
                if let Some(dim0) = shape.first_mut() {
                    *dim0 = 1;
                }
                // row_cuts gave n + 1 non-decreasing offsets within the data.
                let (start, end) = (cut.get(i).copied().unwrap_or(0), cut.get(i + 1).copied().unwrap_or(0));
                Tensor {
                    name: t.name.clone(),
                    datatype: t.datatype,
                    shape,
                    data: t.data.slice(start..end.max(start)),
                }
            })
            .collect(),
        input_parameters: req.input_parameters.clone(),
        outputs: req.outputs.clone(),
    };
    Ok((0..ones.len()).map(row).collect())
}

/// One answer holding the rows of every one of `answers`, in order: each output
/// concatenated along dimension 0. The first answer gives the model, parameters and
/// the outputs' order; every other must have the same outputs (names, datatypes and
/// dimensions after the first), else [`BatchError::BadOutput`] (rows answered at
/// different times by a model that changed). No id.
pub fn join(answers: &[&InferResponse]) -> Result<InferResponse, BatchError> {
    let (first, _) = answers.split_first().ok_or(BatchError::Empty)?;
    let mut outputs = Vec::with_capacity(first.outputs.len());
    for (j, t) in first.outputs.iter().enumerate() {
        let (_, trailing) = t.shape.split_first().ok_or_else(|| BatchError::BadOutput {
            output: t.name.clone(),
            problem: "is a scalar (rank 0), so it has no rows to join".into(),
        })?;
        let mut rows = 0u64;
        for a in answers {
            let same = a
                .outputs
                .get(j)
                .filter(|o| o.name == t.name && o.datatype == t.datatype && o.shape.get(1..) == Some(trailing));
            let Some(o) = same.filter(|_| a.outputs.len() == first.outputs.len()) else {
                return Err(BatchError::BadOutput {
                    output: t.name.clone(),
                    problem: "differs between rows answered at different times (the model changed?)".into(),
                });
            };
            let n = o.shape.first().copied().unwrap_or(0);
            rows = rows.checked_add(n).ok_or(BatchError::TooManyRows)?;
        }
        let mut shape = t.shape.clone();
        if let Some(dim0) = shape.first_mut() {
            *dim0 = rows;
        }
        let parts = answers.iter().filter_map(|a| a.outputs.get(j)).map(|o| &o.data);
        outputs.push(Tensor {
            name: t.name.clone(),
            datatype: t.datatype,
            shape,
            data: append(parts),
        });
    }
    Ok(InferResponse {
        model_name: first.model_name.clone(),
        model_version: first.model_version.clone(),
        id: None,
        parameters: first.parameters.clone(),
        outputs,
        output_parameters: first.output_parameters.clone(),
    })
}
