//! Edits to policy texts: a route replaced, a route merge-patched, read back as JSON.
//!
//! Edits go through `toml_edit`, so everything the edit does not touch (comments,
//! blank lines, key order, other routes) stays exactly as the operator wrote it; a
//! replaced value keeps its trailing comment. JSON is the admin API's shape of a route:
//! the same keys as its `[routes.NAME]` table, durations as strings ("20ms").

use serde_json::{Map, Value};
use toml_edit::{DocumentMut, Item, Table, TableLike};

use crate::policy::file::RouteFile;

/// Longest route name the admin API creates (it names the route's new file too).
const MAX_NAME: usize = 64;

/// An edit that cannot be made, with the dotted path of what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bad {
    /// Dotted path, e.g. `routes.r.flags.micro_batch`.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

/// Checks a route name the admin API may create: it becomes a TOML key and a file name.
pub fn route_name(name: &str) -> Result<(), Bad> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    ok.then_some(()).ok_or_else(|| Bad {
        path: "routes".into(),
        message: format!("route name {name:?} must be 1 to {MAX_NAME} letters, digits, '_' or '-'"),
    })
}

/// Route `name` as written in `text`, as JSON; `None` when the text does not define it.
pub fn route_spec(text: &str, name: &str) -> Option<Value> {
    let table: toml::Table = toml::from_str(text).ok()?;
    let route = table.get("routes")?.get(name)?;
    serde_json::to_value(route).ok()
}

/// `text` with route `name` replaced by (or set to) `spec`.
pub fn put_route(text: &str, name: &str, spec: &Value) -> Result<String, Bad> {
    check_shape(name, spec)?;
    let mut doc = parse(text)?;
    let table = to_table(spec, &format!("routes.{name}"))?;
    routes(&mut doc)?.insert(name, Item::Table(table));
    Ok(doc.to_string())
}

/// `text` with the JSON merge patch (RFC 7396) `patch` applied to route `name`, which
/// must exist: `null` removes a key, objects merge, anything else replaces.
pub fn patch_route(text: &str, name: &str, patch: &Value) -> Result<String, Bad> {
    let Value::Object(patch) = patch else {
        return Err(bad(
            format!("routes.{name}"),
            "a patch is a JSON object of the keys to change",
        ));
    };
    let mut doc = parse(text)?;
    let route = routes(&mut doc)?
        .get_mut(name)
        .and_then(Item::as_table_like_mut)
        .ok_or_else(|| bad(format!("routes.{name}"), "no such route in its file"))?;
    merge(route, patch, &format!("routes.{name}"))?;
    let text = doc.to_string();
    let spec = route_spec(&text, name).unwrap_or(Value::Null);
    check_shape(name, &spec)?;
    Ok(text)
}

/// A new policy file holding only route `name`.
pub fn new_file(name: &str, spec: &Value) -> Result<String, Bad> {
    let route = put_route("", name, spec)?;
    Ok(format!(
        "# Route {name}, created through the tiergate admin API.\n{route}"
    ))
}

/// Checks `spec` against the policy file's shape (known keys, right types), so the
/// caller hears the path of a typo rather than a line in a file it never wrote.
fn check_shape(name: &str, spec: &Value) -> Result<(), Bad> {
    serde_path_to_error::deserialize::<_, RouteFile>(spec)
        .map(drop)
        .map_err(|e| {
            let inner = e.path().to_string();
            let path = match inner.as_str() {
                "." | "" => format!("routes.{name}"),
                p => format!("routes.{name}.{p}"),
            };
            bad(path, e.inner().to_string())
        })
}

fn parse(text: &str) -> Result<DocumentMut, Bad> {
    text.parse::<DocumentMut>()
        .map_err(|e| bad(String::new(), format!("the policy file is not valid TOML: {e}")))
}

/// The document's `routes` table, created (without a header of its own) when absent.
fn routes(doc: &mut DocumentMut) -> Result<&mut dyn TableLike, Bad> {
    let item = doc.as_table_mut().entry("routes").or_insert_with(|| {
        let mut t = Table::new();
        t.set_implicit(true);
        Item::Table(t)
    });
    item.as_table_like_mut().ok_or_else(|| bad("routes", "is not a table"))
}

fn merge(table: &mut dyn TableLike, patch: &Map<String, Value>, path: &str) -> Result<(), Bad> {
    for (key, value) in patch {
        let here = format!("{path}.{key}");
        match value {
            Value::Null => {
                table.remove(key);
            }
            Value::Object(inner) => match table.get_mut(key).and_then(Item::as_table_like_mut) {
                Some(existing) => merge(existing, inner, &here)?,
                None => {
                    table.insert(key, Item::Table(to_table(&without_nulls(value), &here)?));
                }
            },
            other => {
                let mut new = to_value(other, &here)?;
                if let Some(old) = table.get(key).and_then(Item::as_value) {
                    *new.decor_mut() = old.decor().clone(); // keep `# comments` beside it
                }
                table.insert(key, Item::Value(new));
            }
        }
    }
    Ok(())
}

/// A JSON object as a TOML table: nested objects become `[a.b]` sub-tables.
fn to_table(value: &Value, path: &str) -> Result<Table, Bad> {
    let Value::Object(map) = value else {
        return Err(bad(path, "must be a JSON object (a table)"));
    };
    let mut table = Table::new();
    for (key, v) in map {
        let here = format!("{path}.{key}");
        let item = match v {
            Value::Object(_) => Item::Table(to_table(v, &here)?),
            other => Item::Value(to_value(other, &here)?),
        };
        table.insert(key, item);
    }
    Ok(table)
}

fn to_value(value: &Value, path: &str) -> Result<toml_edit::Value, Bad> {
    Ok(match value {
        Value::Null => return Err(bad(path, "null is not a value here; leave the key out instead")),
        Value::Bool(b) => (*b).into(),
        Value::String(s) => s.as_str().into(),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => i.into(),
            (None, Some(f)) => f.into(),
            (None, None) => return Err(bad(path, format!("{n} is out of range"))),
        },
        Value::Array(items) => {
            let mut array = toml_edit::Array::new();
            for (i, item) in items.iter().enumerate() {
                array.push(to_value(item, &format!("{path}[{i}]"))?);
            }
            toml_edit::Value::Array(array)
        }
        Value::Object(map) => {
            let mut inline = toml_edit::InlineTable::new();
            for (key, v) in map {
                inline.insert(key, to_value(v, &format!("{path}.{key}"))?);
            }
            toml_edit::Value::InlineTable(inline)
        }
    })
}

fn without_nulls(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn bad(path: impl Into<String>, message: impl Into<String>) -> Bad {
    Bad {
        path: path.into(),
        message: message.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const FILE: &str = "# Our routes.\n[routes.r]\nmodels = [\"m\"] # the model\n\n[routes.r.flags]\n\
                        micro_batch = true   # on since Monday\n\n# Another route.\n[routes.other]\nmodels = [\"o\"]\n";

    #[test]
    fn a_patch_changes_one_value_and_keeps_every_comment() {
        let text = patch_route(FILE, "r", &json!({"flags": {"micro_batch": false}})).expect("patched");
        assert_eq!(text, FILE.replace("micro_batch = true", "micro_batch = false"));
    }

    #[test]
    fn null_removes_and_new_tables_appear() {
        let text = patch_route(
            FILE,
            "r",
            &json!({"flags": null, "realtime": {"endpoints": ["http://h:1"]}}),
        )
        .expect("patched");
        let spec = route_spec(&text, "r").expect("route");
        assert_eq!(
            spec,
            json!({"models": ["m"], "realtime": {"endpoints": ["http://h:1"]}})
        );
        assert!(text.contains("# Another route."), "{text}");
    }

    #[test]
    fn put_replaces_a_route_and_leaves_the_others() {
        let spec = json!({"models": ["m2"], "flags": {"realtime": true}, "realtime": {"endpoints": ["http://h:1"]}});
        let text = put_route(FILE, "r", &spec).expect("put");
        assert_eq!(route_spec(&text, "r"), Some(spec));
        assert_eq!(route_spec(&text, "other"), Some(json!({"models": ["o"]})));
        assert!(text.contains("# Another route."), "{text}");
    }

    #[test]
    fn a_new_file_starts_with_its_comment() {
        let text = new_file("n", &json!({"models": ["n"]})).expect("new");
        assert_eq!(
            text,
            "# Route n, created through the tiergate admin API.\n[routes.n]\nmodels = [\"n\"]\n"
        );
    }

    #[test]
    fn shape_errors_name_the_path() {
        let err = patch_route(FILE, "r", &json!({"flags": {"micro_bach": true}})).expect_err("typo");
        assert_eq!(err.path, "routes.r.flags.micro_bach");
        assert!(err.message.contains("micro_bach"), "{}", err.message);
        let err = put_route(FILE, "r", &json!({"flags": {"realtime": "yes"}})).expect_err("type");
        assert_eq!(err.path, "routes.r.flags.realtime");
        let err = put_route(FILE, "r", &json!({"models": [null]})).expect_err("null");
        assert!(err.path.starts_with("routes.r.models"), "{err:?}");
        assert!(route_name("../etc").is_err() && route_name("ok_name-1").is_ok());
    }
}
