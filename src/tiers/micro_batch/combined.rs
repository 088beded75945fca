//! Several models in one pass: a route's batch pool may serve models as one combined
//! model (`[routes.NAME.micro_batch.combined.MODEL]`: a Triton ensemble, a multi-head
//! model taking the same inputs). A caller of a member model (`/v2/models/ctr/infer`)
//! then waits in a lane of the combined model's path keyed by its inputs alone, so the
//! callers of every member with the same input signature share one backend call; the
//! call asks for every output of the members in it, by the combined model's names, and
//! each caller gets back only its own model's outputs, under its model's names, as it
//! asked for them (the outputs it named, in its order, JSON or binary).

use std::sync::Arc;

use super::Unbatched;
use crate::error::{Error, Kind};
use crate::policy::{BatchSpec, Member};
use crate::protocol::{InferRequest, InferResponse, RequestedOutput};

/// A caller of a member model: which model it asked for and what of its answer.
#[derive(Debug)]
pub(super) struct Asked {
    /// The model the caller named.
    model: String,
    member: Arc<Member>,
    /// The caller's requested outputs (by its model's names) and request parameters:
    /// what its answer holds and how each output is encoded.
    caller: InferRequest,
}

/// The member model `path` asks for, when `spec` computes it as part of a combined
/// model, with the combined model's infer path. Only `/v2/models/NAME/infer`: a
/// caller naming a version asks for that version of its own model.
pub(super) fn member<'a>(spec: &'a BatchSpec, path: &str) -> Option<(&'a str, &'a Arc<Member>, String)> {
    let name = path.strip_prefix("/v2/models/")?.strip_suffix("/infer")?;
    let (name, member) = spec.combined.get_key_value(name)?;
    Some((name, member, format!("/v2/models/{}/infer", member.combined)))
}

/// Takes the caller's requested outputs out of `req` (the batch asks for its members'
/// outputs by the combined model's names) and keeps them. A 400 names an output the
/// member does not have; an output asked with parameters of its own (Triton's
/// `classification`, which changes what is computed) cannot share the combined call.
pub(super) fn ask(
    model: &str,
    member: &Arc<Member>,
    req: &mut InferRequest,
) -> Result<Result<Asked, Unbatched>, Error> {
    for (i, out) in req.outputs.iter().enumerate() {
        if !member.outputs.iter().any(|(own, _)| *own == out.name) {
            let names: Vec<&str> = member.outputs.iter().map(|(own, _)| own.as_str()).collect();
            return Err(Error::new(
                Kind::BadRequest,
                format!(
                    "outputs[{i}].name {:?} is not an output of model {model:?} (it has {})",
                    out.name,
                    names.join(", ")
                ),
            ));
        }
        if req.outputs[..i].iter().any(|o| o.name == out.name) {
            return Err(Error::new(
                Kind::BadRequest,
                format!("outputs[{i}].name {:?} is requested twice", out.name),
            ));
        }
        if !out.parameters.is_empty() {
            return Ok(Err(Unbatched(format!(
                "output {:?} is asked with parameters of its own, which the combined model {} cannot be asked for one caller",
                out.name, member.combined
            ))));
        }
    }
    let caller = InferRequest {
        outputs: std::mem::take(&mut req.outputs),
        parameters: req.parameters.clone(),
        ..InferRequest::default()
    };
    Ok(Ok(Asked {
        model: model.to_owned(),
        member: member.clone(),
        caller,
    }))
}

/// What a batch asks the combined model for: every output of every member among
/// `asked`, by the combined model's names, each once, in order; empty when no caller is
/// a member's.
pub(super) fn outputs<'a>(asked: impl Iterator<Item = &'a Asked>) -> Vec<RequestedOutput> {
    let mut outputs: Vec<RequestedOutput> = Vec::new();
    for a in asked {
        for (_, theirs) in &a.member.outputs {
            if !outputs.iter().any(|o| o.name == *theirs) {
                outputs.push(RequestedOutput {
                    name: theirs.clone(),
                    binary_data: None,
                    parameters: Default::default(),
                });
            }
        }
    }
    outputs
}

impl Asked {
    /// The member's answer within the combined model's `answer` (already cut to this
    /// caller's rows): every output of the member, in the member's order and under its
    /// names, the model its own. It is what the member alone would answer a request
    /// naming no outputs, and so what the cache keeps. A 502 when the combined model
    /// left one of them out.
    pub fn view(&self, mut answer: InferResponse) -> Result<InferResponse, Error> {
        let mut outputs = Vec::with_capacity(self.member.outputs.len());
        let mut output_parameters = std::collections::BTreeMap::new();
        for (own, theirs) in &self.member.outputs {
            let Some(tensor) = answer.outputs.iter().find(|t| t.name == *theirs) else {
                return Err(Error::new(
                    Kind::Backend,
                    format!(
                        "the combined model {} answered without output {theirs:?} (model {}'s {own:?})",
                        self.member.combined, self.model
                    ),
                ));
            };
            outputs.push(crate::protocol::Tensor {
                name: own.clone(),
                ..tensor.clone()
            });
            if let Some(p) = answer.output_parameters.get(theirs) {
                output_parameters.insert(own.clone(), p.clone());
            }
        }
        answer.model_name.clone_from(&self.model);
        answer.model_version = None; // the combined model's version is not the member's
        answer.outputs = outputs;
        answer.output_parameters = output_parameters;
        Ok(answer)
    }

    /// Of the member's answer, the outputs the caller named, in its order (all when it
    /// named none).
    pub fn pick(&self, mut answer: InferResponse) -> InferResponse {
        if self.caller.outputs.is_empty() {
            return answer;
        }
        let mut all = std::mem::take(&mut answer.outputs);
        for wanted in &self.caller.outputs {
            if let Some(i) = all.iter().position(|t| t.name == wanted.name) {
                answer.outputs.push(all.swap_remove(i));
            }
        }
        answer
            .output_parameters
            .retain(|name, _| answer.outputs.iter().any(|t| t.name == *name));
        answer
    }

    /// Whether the caller asked for output `name` (its model's name) in binary.
    pub fn wants_binary(&self, name: &str) -> bool {
        self.caller.wants_binary(name)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test
mod tests {
    use super::*;
    use crate::protocol::{Datatype, Tensor};

    fn member() -> Arc<Member> {
        Arc::new(Member {
            combined: "heads".into(),
            outputs: vec![("prob".into(), "ctr_prob".into()), ("logit".into(), "ctr_logit".into())],
        })
    }

    fn tensor(name: &str, value: f64) -> Tensor {
        Tensor {
            name: name.into(),
            datatype: Datatype::Fp64,
            shape: vec![1],
            data: value.to_le_bytes().to_vec().into(),
        }
    }

    fn wants(names: &[&str]) -> InferRequest {
        InferRequest {
            outputs: names
                .iter()
                .map(|n| RequestedOutput {
                    name: (*n).into(),
                    binary_data: Some(*n == "logit"),
                    parameters: Default::default(),
                })
                .collect(),
            ..InferRequest::default()
        }
    }

    fn combined_answer() -> InferResponse {
        InferResponse {
            model_name: "heads".into(),
            model_version: Some("7".into()),
            id: Some("b".into()),
            parameters: Default::default(),
            outputs: vec![
                tensor("cvr_prob", 9.0),
                tensor("ctr_logit", 2.0),
                tensor("ctr_prob", 1.0),
            ],
            output_parameters: Default::default(),
        }
    }

    #[test]
    fn a_caller_gets_its_models_outputs_renamed_in_its_order() {
        let mut req = wants(&["logit", "prob"]);
        let asked = ask("ctr", &member(), &mut req).unwrap().unwrap();
        assert!(
            req.outputs.is_empty(),
            "the batch asks for the combined model's outputs"
        );
        let answer = asked.pick(asked.view(combined_answer()).unwrap());
        assert_eq!(answer.model_name, "ctr");
        assert_eq!(answer.model_version, None);
        let names: Vec<&str> = answer.outputs.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["logit", "prob"], "cvr's output left out");
        assert_eq!(
            answer.outputs[1].data,
            tensor("", 1.0).data,
            "ctr_prob under its own name"
        );
        assert!(asked.wants_binary("logit") && !asked.wants_binary("prob"));
    }

    #[test]
    fn naming_no_outputs_gets_all_of_the_members() {
        let mut req = wants(&[]);
        let asked = ask("ctr", &member(), &mut req).unwrap().unwrap();
        let answer = asked.pick(asked.view(combined_answer()).unwrap());
        let names: Vec<&str> = answer.outputs.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["prob", "logit"], "the member's order");
    }

    #[test]
    fn unknown_twice_asked_and_parameterised_outputs() {
        let e = ask("ctr", &member(), &mut wants(&["score"])).unwrap_err();
        assert_eq!(e.kind, Kind::BadRequest);
        assert!(e.message.contains("prob, logit"), "{}", e.message);
        let e = ask("ctr", &member(), &mut wants(&["prob", "prob"])).unwrap_err();
        assert!(e.message.contains("twice"), "{}", e.message);
        let mut classified = wants(&["prob"]);
        classified.outputs[0]
            .parameters
            .insert("classification".into(), 2.into());
        assert!(ask("ctr", &member(), &mut classified).unwrap().is_err(), "served alone");
    }

    #[test]
    fn a_missing_output_is_the_backends_fault() {
        let asked = ask("ctr", &member(), &mut wants(&[])).unwrap().unwrap();
        let mut answer = combined_answer();
        answer.outputs.retain(|t| t.name != "ctr_logit");
        let e = asked.view(answer).unwrap_err();
        assert_eq!(e.kind, Kind::Backend);
        assert!(e.message.contains("ctr_logit"), "{}", e.message);
    }

    #[test]
    fn a_batch_asks_for_each_members_outputs_once() {
        let cvr = Arc::new(Member {
            combined: "heads".into(),
            outputs: vec![("prob".into(), "cvr_prob".into()), ("logit".into(), "ctr_logit".into())],
        });
        let a = ask("ctr", &member(), &mut wants(&["prob"])).unwrap().unwrap();
        let b = ask("cvr", &cvr, &mut wants(&[])).unwrap().unwrap();
        let names: Vec<String> = outputs([&a, &b, &a].into_iter()).into_iter().map(|o| o.name).collect();
        assert_eq!(names, ["ctr_prob", "ctr_logit", "cvr_prob"]);
        assert!(outputs(std::iter::empty()).is_empty());
    }
}
