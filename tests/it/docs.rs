//! The docs that describe the tree stay true to it: docs/architecture.md's module table
//! names every module of `src/` (each file or folder at the top, and each file or folder
//! it lists inside one), and nothing that is not there.

use std::collections::BTreeSet;
use std::path::Path;

/// The module table's first column: each row's names, as written (`front/`, `main`).
fn table_rows(text: &str) -> Vec<(Vec<String>, String)> {
    let start = text
        .find("## Modules")
        .expect("docs/architecture.md has a Modules section");
    let table = &text[start..];
    table
        .lines()
        .skip_while(|l| !l.starts_with("| module"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|row| {
            let mut cells = row.trim_matches('|').splitn(2, '|');
            let names = cells.next().unwrap_or_default();
            let role = cells.next().unwrap_or_default().to_owned();
            let names = names
                .split(',')
                .map(|n| n.trim().trim_matches('`').to_owned())
                .collect();
            (names, role)
        })
        .collect()
}

/// The top-level modules of `src/`: folders as `name/`, files as `name` (no `lib`; a
/// folder beside a file of its name holds that file's submodules).
fn top_level(src: &Path) -> BTreeSet<String> {
    std::fs::read_dir(src)
        .expect("src/ reads")
        .map(|e| e.expect("an entry"))
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            match e.file_type().expect("a type").is_dir() {
                true if src.join(format!("{name}.rs")).exists() => None,
                true => Some(format!("{name}/")),
                false => name.strip_suffix(".rs").filter(|n| *n != "lib").map(str::to_owned),
            }
        })
        .collect()
}

/// The modules inside folder `dir` of `src/`: files (without `.rs`, `mod` and tests)
/// and folders.
fn inside(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .expect("the folder reads")
        .map(|e| e.expect("an entry"))
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let name = name.strip_suffix(".rs").map_or(name.clone(), str::to_owned);
            let test = name == "tests" || name.ends_with("_tests") || name == "proptests" || name == "mod";
            (!test).then_some(name)
        })
        .collect()
}

#[test]
fn the_module_table_matches_the_tree() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("docs/architecture.md")).expect("docs/architecture.md reads");
    let rows = table_rows(&text);
    let listed: BTreeSet<String> = rows.iter().flat_map(|(names, _)| names.iter().cloned()).collect();
    let tree = top_level(&root.join("src"));
    let missing: Vec<_> = tree.difference(&listed).collect();
    let stale: Vec<_> = listed.difference(&tree).collect();
    assert!(
        missing.is_empty(),
        "modules of src/ missing from docs/architecture.md's table: {missing:?}"
    );
    assert!(
        stale.is_empty(),
        "docs/architecture.md's table lists modules src/ does not have: {stale:?}"
    );
    // Inside each folder, every module is named in its row (as `name`).
    let mut unnamed = Vec::new();
    for (names, role) in &rows {
        for folder in names.iter().filter(|n| n.ends_with('/')) {
            let dir = root.join("src").join(folder.trim_end_matches('/'));
            for module in inside(&dir) {
                if !role.contains(&format!("`{module}`")) && !role.contains(&format!("`{module}/`")) {
                    unnamed.push(format!("{folder}{module}"));
                }
            }
        }
    }
    assert!(
        unnamed.is_empty(),
        "modules docs/architecture.md's table does not name in their folder's row: {unnamed:?}"
    );
}
