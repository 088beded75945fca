//! A typed policy builder for tests: a route's models or paths, flags, pools and tables
//! set by key, written as the TOML a policy file holds (values quoted and typed by the
//! `toml` crate, never by hand). Tests about the file format itself keep raw TOML.
//!
//! ```ignore
//! let text = Route::new("r").model("m").realtime(&rt.url()).set("realtime.max_concurrency", 1)
//!     .set("limits.tenant_rate", 0.1).toml();
//! ```

use toml::{Table, Value};

/// One route of a policy, built key by key.
#[derive(Debug, Clone)]
pub struct Route {
    name: String,
    table: Table,
}

impl Route {
    /// A route called `name`, with nothing set yet.
    pub fn new(name: &str) -> Route {
        Route {
            name: name.to_owned(),
            table: Table::new(),
        }
    }

    /// Serves model `m` (may be repeated).
    pub fn model(self, m: &str) -> Route {
        self.push("models", m)
    }

    /// Serves JSON path `p` (may be repeated).
    pub fn path(self, p: &str) -> Route {
        self.push("paths", p)
    }

    /// The real-time pool: one endpoint at `url`.
    pub fn realtime(self, url: &str) -> Route {
        self.set("realtime.endpoints", vec![url.to_owned()])
    }

    /// The batch pool: one endpoint at `url`.
    pub fn batch(self, url: &str) -> Route {
        self.set("micro_batch.endpoints", vec![url.to_owned()])
    }

    /// Flag `flag` on or off.
    pub fn flag(self, flag: &str, on: bool) -> Route {
        self.set(&format!("flags.{flag}"), on)
    }

    /// Flags `flags` on, every other tier flag (`realtime`, `micro_batch`, `offline`) off.
    pub fn only(self, flags: &[&str]) -> Route {
        ["realtime", "micro_batch", "offline"]
            .into_iter()
            .fold(self, |route, tier| route.flag(tier, flags.contains(&tier)))
            .flags(flags)
    }

    /// Flags `flags` on (others as they were).
    pub fn flags(self, flags: &[&str]) -> Route {
        flags.iter().fold(self, |route, flag| route.flag(flag, true))
    }

    /// An empty table at `key` (a `[routes.NAME.cache]` with every default).
    pub fn table(mut self, key: &str) -> Route {
        let (parent, last) = self.parent(key);
        parent.entry(last).or_insert_with(|| Value::Table(Table::new()));
        self
    }

    /// `key` (dotted, below the route: `realtime.max_concurrency`) set to `value`.
    pub fn set(mut self, key: &str, value: impl Into<Value>) -> Route {
        let (parent, last) = self.parent(key);
        parent.insert(last, value.into());
        self
    }

    /// The route as a policy file's text.
    pub fn toml(&self) -> String {
        let mut routes = Table::new();
        routes.insert(self.name.clone(), Value::Table(self.table.clone()));
        let mut file = Table::new();
        file.insert("routes".into(), Value::Table(routes));
        toml::to_string(&file).expect("a table of tables always serializes")
    }

    /// Appends `value` to the array at `key`.
    fn push(mut self, key: &str, value: &str) -> Route {
        let (parent, last) = self.parent(key);
        match parent.entry(last).or_insert_with(|| Value::Array(Vec::new())) {
            Value::Array(items) => items.push(Value::from(value)),
            other => panic!("{key} is {other}, not an array"),
        }
        self
    }

    /// The table holding the last part of dotted `key`, made as needed, and that part.
    fn parent(&mut self, key: &str) -> (&mut Table, String) {
        let mut parts: Vec<&str> = key.split('.').collect();
        let last = parts.pop().expect("split gives at least one part").to_owned();
        let mut table = &mut self.table;
        for part in parts {
            table = match table.entry(part).or_insert_with(|| Value::Table(Table::new())) {
                Value::Table(t) => t,
                other => panic!("{part} in {key} is {other}, not a table"),
            };
        }
        (table, last)
    }
}

#[cfg(test)]
mod tests {
    use super::Route;

    #[test]
    fn a_route_is_written_as_the_file_would_hold_it() {
        let text = Route::new("r")
            .model("m")
            .realtime("http://127.0.0.1:1")
            .set("realtime.max_concurrency", 1)
            .set("limits.tenant_rate", 0.5)
            .only(&["realtime"])
            .table("cache")
            .toml();
        let parsed: toml::Table = toml::from_str(&text).expect("valid TOML");
        let r = &parsed["routes"]["r"];
        assert_eq!(r["models"][0].as_str(), Some("m"));
        assert_eq!(r["realtime"]["max_concurrency"].as_integer(), Some(1));
        assert_eq!(r["limits"]["tenant_rate"].as_float(), Some(0.5));
        assert_eq!(r["flags"]["realtime"].as_bool(), Some(true));
        assert_eq!(r["flags"]["micro_batch"].as_bool(), Some(false));
        assert!(r["cache"].as_table().is_some_and(toml::Table::is_empty));
    }
}
