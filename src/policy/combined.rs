//! `[routes.NAME.micro_batch.combined.MODEL]`: the models a batch pool's backends serve
//! as one combined model, and which of its outputs are each member's.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::file::OutputsFile;
use super::model::Member;
use super::problems::Check;

/// Most member models one route names, over all its combined models.
const MAX_MEMBERS: usize = 256;
/// Most outputs one member names.
const MAX_OUTPUTS: usize = 256;
/// Longest model or output name.
const MAX_NAME: usize = 256;

/// The members the `combined` table at `at` names, by member name; every problem
/// reported with its path.
pub(super) fn members(
    check: &mut Check<'_>,
    at: &str,
    file: &BTreeMap<String, BTreeMap<String, OutputsFile>>,
) -> BTreeMap<String, Arc<Member>> {
    let mut members: BTreeMap<String, Arc<Member>> = BTreeMap::new();
    for (combined, table) in file {
        let at = format!("{at}.{combined}");
        if let Err(why) = model_name(combined) {
            check.fail(&at, format!("the combined model's name {why}"));
        }
        if table.is_empty() {
            check.fail(
                &at,
                "names no member: add one line per model it computes, such as ctr = { score = \"ctr_score\" }",
            );
        }
        for (member, outputs) in table {
            let at = format!("{at}.{member}");
            if let Err(why) = model_name(member) {
                check.fail(&at, format!("the member's name {why}"));
            }
            if file.contains_key(member) {
                check.fail(
                    &at,
                    format!("{member} is itself a combined model; a member is another model"),
                );
            }
            if let Some(first) = members.get(member) {
                check.fail(
                    &at,
                    format!(
                        "{member} is already a member of {}; a model belongs to one combined model",
                        first.combined
                    ),
                );
            }
            members.insert(
                member.clone(),
                Arc::new(Member {
                    combined: combined.clone(),
                    outputs: member_outputs(check, &at, outputs),
                }),
            );
        }
    }
    if members.len() > MAX_MEMBERS {
        check.fail(
            at,
            format!("names {} member models; at most {MAX_MEMBERS}", members.len()),
        );
    }
    members
}

/// Reports every member that is not one of the route's `models`: its callers would
/// never reach the route.
pub(super) fn reachable(check: &mut Check<'_>, at: &str, members: &BTreeMap<String, Arc<Member>>, models: &[String]) {
    for (member, spec) in members {
        if !models.contains(member) {
            check.fail(
                format!("{at}.{}.{member}", spec.combined),
                format!("{member} is not one of the route's models; add it to `models` so its callers reach the route"),
            );
        }
    }
}

/// A member's outputs, as (its name, the combined model's name).
fn member_outputs(check: &mut Check<'_>, at: &str, file: &OutputsFile) -> Vec<(String, String)> {
    let file = &file.0;
    if file.is_empty() {
        check.fail(
            at,
            "names no output: map each of the member's outputs to the combined model's, such as { score = \"ctr_score\" }",
        );
    }
    if file.len() > MAX_OUTPUTS {
        check.fail(at, format!("names {} outputs; at most {MAX_OUTPUTS}", file.len()));
    }
    let mut outputs = Vec::with_capacity(file.len());
    for (own, theirs) in file {
        for name in [own, theirs] {
            if name.is_empty() || name.len() > MAX_NAME || name.chars().any(char::is_control) {
                check.fail(
                    format!("{at}.{own}"),
                    format!("{name:?} is not an output name: 1 to {MAX_NAME} characters, none a control character"),
                );
            }
        }
        outputs.push((own.clone(), theirs.clone()));
    }
    outputs
}

/// Whether `name` can be a model's name in `/v2/models/NAME/infer`; why not when it
/// cannot.
fn model_name(name: &str) -> Result<(), String> {
    let fits = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    if name.is_empty() || name.len() > MAX_NAME || !name.chars().all(fits) || name == "." || name == ".." {
        return Err(format!(
            "{name:?} is not a model name: 1 to {MAX_NAME} letters, digits, '_', '-' or '.'"
        ));
    }
    Ok(())
}
