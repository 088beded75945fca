//! OpenAI completions coalesced (`json_adapter = "openai_completions"`): callers'
//! `/v1/completions` calls with string prompts and otherwise the same body are sent as
//! one call whose `prompt` is every caller's prompts in order; the answer's `choices`
//! (`n` a prompt, `index` = prompt × n + choice) are cut back by prompt, each caller's
//! indexed afresh. The batch's `usage` is split exactly where every choice carries its
//! token ids (`prompt_token_ids`, `token_ids`: vLLM's `return_token_ids`); otherwise in
//! proportion to the prompts' and the choices' text, and marked `tiergate_estimated`.
//! A streamed batch's one stream is cut into one stream per caller ([`super::stream`]).

use serde_json::{Map, Value};

use super::{Layout, Part, Rows};

/// A completions body's prompts as rows: a string, or a list of strings; `None` for
/// token ids or anything else (sent alone).
pub(super) fn rows(body: &mut Map<String, Value>) -> Option<Rows> {
    match body.get("prompt")? {
        Value::String(_) => Some((Layout::Prompt, vec![vec![body.remove("prompt")?]])),
        Value::Array(list) if !list.is_empty() && list.iter().all(Value::is_string) => {
            let Some(Value::Array(list)) = body.remove("prompt") else {
                return None;
            };
            Some((Layout::Prompt, vec![list]))
        }
        _ => None,
    }
}

/// Choices per prompt that `rest` (a caller's body without its prompt) asks for.
pub(super) fn choices(rest: &Map<String, Value>) -> usize {
    rest.get("n")
        .and_then(Value::as_u64)
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(1)
        .max(1)
}

/// The batch's answer `body` cut into one answer per caller of `parts` (`rows` prompts
/// each, `total` in all).
pub(super) fn answers(
    body: &mut Map<String, Value>,
    parts: &[&Part],
    rows: &[usize],
    total: usize,
) -> Result<Vec<Map<String, Value>>, String> {
    let n = parts.first().map_or(1, |p| choices(&p.rest));
    let Some(Value::Array(list)) = body.remove("choices") else {
        return Err("its answer has no \"choices\" array".into());
    };
    if list.len() != total * n {
        return Err(format!(
            "\"choices\" has {} items but the batch asked for {} ({total} prompts, n = {n})",
            list.len(),
            total * n
        ));
    }
    let mut ordered: Vec<Option<Value>> = vec![None; total * n];
    for choice in list {
        let index = choice
            .get("index")
            .and_then(Value::as_u64)
            .and_then(|i| usize::try_from(i).ok());
        match index.and_then(|i| ordered.get_mut(i)) {
            Some(slot @ None) => *slot = Some(choice),
            Some(Some(_)) => return Err("two choices share an index".into()),
            None => return Err(format!("a choice has no index in 0..{}", total * n)),
        }
    }
    let ordered: Vec<Value> = ordered.into_iter().flatten().collect();
    let per_caller: Vec<usize> = rows.iter().map(|r| r * n).collect();
    let cut = super::cut(ordered, &per_caller);
    let usage = body.remove("usage");
    let split = usage.as_ref().map(|u| split(u, parts, &cut));
    Ok(cut
        .into_iter()
        .enumerate()
        .map(|(c, caller)| {
            let mut answer = body.clone();
            answer.insert("choices".into(), Value::Array(super::renumbered(caller)));
            if let Some(split) = &split {
                answer.insert("usage".into(), split[c].clone());
            }
            answer
        })
        .collect())
}

/// The batch's `usage` split between the callers whose choices are `cut`: exactly when
/// every choice carries its token ids, else in proportion to each caller's prompt text
/// (prompt tokens) and choices' text (completion tokens), the remainder to the last, and
/// marked `tiergate_estimated`.
fn split(usage: &Value, parts: &[&Part], cut: &[Vec<Value>]) -> Vec<Value> {
    let count = |key: &str| usage.get(key).and_then(Value::as_u64).unwrap_or(0);
    let ids = |choice: &Value, key: &str| choice.get(key).and_then(Value::as_array).map(|a| a.len() as u64);
    let n = parts.first().map_or(1, |p| choices(&p.rest));
    let exact: Option<Vec<(u64, u64)>> = cut
        .iter()
        .map(|caller| {
            let completion = caller.iter().map(|c| ids(c, "token_ids")).sum::<Option<u64>>()?;
            let prompt = caller
                .iter()
                .step_by(n)
                .map(|c| ids(c, "prompt_token_ids"))
                .sum::<Option<u64>>()?;
            Some((prompt, completion))
        })
        .collect();
    let (counts, estimated) = match exact {
        Some(counts) => (counts, false),
        None => {
            let text = |v: &Value| v.as_str().map_or(0, |s| s.len() as u64);
            let prompts: Vec<u64> = parts.iter().map(|p| prompt_text(p)).collect();
            let outputs: Vec<u64> = cut
                .iter()
                .map(|caller| caller.iter().map(|c| c.get("text").map_or(0, text)).sum::<u64>().max(1))
                .collect();
            let p = proportion(count("prompt_tokens"), &prompts);
            let o = proportion(count("completion_tokens"), &outputs);
            (p.into_iter().zip(o).collect(), true)
        }
    };
    counts
        .into_iter()
        .map(|(prompt, completion)| counted(prompt, completion, estimated))
        .collect()
}

/// A caller's prompts' text in bytes (at least 1): its weight when a batch's prompt
/// tokens are split in proportion.
pub(super) fn prompt_text(part: &Part) -> u64 {
    let text = |v: &Value| v.as_str().map_or(0, |s| s.len() as u64);
    part.columns.iter().flatten().map(text).sum::<u64>().max(1)
}

/// A `usage` of `prompt` and `completion` tokens, marked `tiergate_estimated` when
/// `estimated`.
pub(super) fn counted(prompt: u64, completion: u64, estimated: bool) -> Value {
    let mut usage = serde_json::json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    });
    if estimated {
        usage["tiergate_estimated"] = Value::Bool(true);
    }
    usage
}

/// `whole` split in proportion to `weights`, rounded down, the remainder to the last:
/// the parts add up to `whole`.
pub(super) fn proportion(whole: u64, weights: &[u64]) -> Vec<u64> {
    let sum: u128 = weights.iter().map(|w| u128::from(*w)).sum::<u128>().max(1);
    let mut parts: Vec<u64> = weights
        .iter()
        .map(|w| (u128::from(whole) * u128::from(*w) / sum) as u64)
        .collect();
    let given: u64 = parts.iter().sum();
    if let Some(last) = parts.last_mut() {
        *last += whole - given;
    }
    parts
}

/// One caller's answer joined from answers to its prompts one by one, in order: the
/// first's, with every choice indexed afresh and the usage summed.
pub(super) fn join(
    first: &mut Map<String, Value>,
    rest: impl Iterator<Item = Map<String, Value>>,
) -> Result<(), String> {
    let mut all = match first.remove("choices") {
        Some(Value::Array(list)) => list,
        _ => return Err("a prompt's answer has no \"choices\" array".into()),
    };
    let mut usage = first.remove("usage");
    for mut answer in rest {
        match answer.remove("choices") {
            Some(Value::Array(more)) => all.extend(more),
            _ => return Err("a prompt's answer has no \"choices\" array".into()),
        }
        usage = super::summed(usage, answer.remove("usage"));
    }
    first.insert("choices".into(), Value::Array(super::renumbered(all)));
    if let Some(usage) = usage {
        first.insert("usage".into(), usage);
    }
    Ok(())
}
