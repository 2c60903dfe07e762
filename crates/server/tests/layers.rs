//! The layering rule of the crate docs, checked on the sources: start-up → adapters →
//! services → foundation, never back, and one adapter never imports another. Every
//! `crate::` path outside comments counts, in `use` lines and inline alike.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Each top-level module, its layer (higher imports lower) and whether its peers in the
/// layer may be imported (adapters may not import one another).
const LAYERS: &[(&str, u8)] = &[
    ("routes", START_UP),
    ("serve", START_UP),
    ("stdio", START_UP),
    ("http", ADAPTER),
    ("mcp", ADAPTER),
    ("service", SERVICE),
    ("admission", FOUNDATION),
    ("answer", FOUNDATION),
    ("audit", FOUNDATION),
    ("budget", FOUNDATION),
    ("caller", FOUNDATION),
    ("config", FOUNDATION),
    ("error", FOUNDATION),
    ("keys", FOUNDATION),
    ("metrics", FOUNDATION),
    ("openapi", FOUNDATION),
    ("sizing", FOUNDATION),
    ("store", FOUNDATION),
    ("wire", FOUNDATION),
];
const START_UP: u8 = 3;
const ADAPTER: u8 = 2;
const SERVICE: u8 = 1;
const FOUNDATION: u8 = 0;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`service/sessions.rs` → `service`).
fn module_of(file: &Path) -> String {
    let rel = file.strip_prefix(src()).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_str()
        .unwrap();
    first.trim_end_matches(".rs").to_owned()
}

/// The text without comments (doc links may name any layer).
fn code(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first segment of every `crate::` path: `crate::a::b` and `crate::{a, b::c}`.
fn crate_paths(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let (mut depth, mut end) = (1, 0);
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    end = j;
                    break;
                }
            }
            let mut depth = 0;
            let mut item = String::new();
            for c in group[..end].chars().chain([',']) {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.push(first_segment(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
        } else {
            found.push(first_segment(rest));
        }
    }
    found.retain(|s| !s.is_empty());
    found
}

fn first_segment(path: &str) -> String {
    path.trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// Names the crate root re-exports, with the module each comes from (`pub use a::{b, c}`).
fn reexports() -> BTreeMap<String, String> {
    let lib = code(&std::fs::read_to_string(src().join("lib.rs")).unwrap());
    let mut names = BTreeMap::new();
    for line in lib.lines() {
        let Some(rest) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let (module, items) = rest.trim_end_matches(';').split_once("::").unwrap();
        for item in items.trim_matches(|c| c == '{' || c == '}').split(',') {
            names.insert(item.trim().to_owned(), module.to_owned());
        }
    }
    names
}

fn layer(module: &str) -> Option<u8> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, l)| *l)
}

/// The rule: below, or the same module, or a peer in a layer whose peers may meet.
fn allowed(from: &str, to: &str) -> bool {
    let (f, t) = (layer(from).unwrap(), layer(to).unwrap());
    t < f || from == to || (t == f && f != ADAPTER)
}

/// Every import that breaks the rule, as `file: crate::x (layer) from module (layer)`.
fn violations() -> Vec<String> {
    let mut files = Vec::new();
    sources(&src(), &mut files);
    let reexported = reexports();
    let mut bad = Vec::new();
    for file in files {
        let from = module_of(&file);
        if from == "lib" {
            continue; // the root only declares modules and holds the shared state
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for name in crate_paths(&code(&text)) {
            let to = match reexported.get(&name) {
                Some(module) => module.clone(),
                None if layer(&name).is_some() => name,
                None => continue, // an item of the root itself (`AppState`, `SharedState`)
            };
            if !allowed(&from, &to) {
                bad.push(format!(
                    "{}: imports crate::{to} (layer {}) from {from} (layer {})",
                    file.display(),
                    layer(&to).unwrap(),
                    layer(&from).unwrap()
                ));
            }
        }
    }
    bad
}

#[test]
fn every_module_has_a_layer_and_every_layer_entry_a_module() {
    let mut files = Vec::new();
    sources(&src(), &mut files);
    let mut modules: Vec<String> = files.iter().map(|f| module_of(f)).collect();
    modules.sort();
    modules.dedup();
    modules.retain(|m| m != "lib");
    let unplaced: Vec<&String> = modules.iter().filter(|m| layer(m).is_none()).collect();
    assert!(
        unplaced.is_empty(),
        "modules without a layer in LAYERS: {unplaced:?}"
    );
    let gone: Vec<&str> = LAYERS
        .iter()
        .map(|(m, _)| *m)
        .filter(|m| !modules.iter().any(|x| x == m))
        .collect();
    assert!(
        gone.is_empty(),
        "LAYERS names modules that do not exist: {gone:?}"
    );
}

#[test]
fn no_module_imports_one_above_it_or_another_adapter() {
    let bad = violations();
    assert!(
        bad.is_empty(),
        "imports against the layers:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_reader_finds_what_it_must() {
    // The checks above are only as good as this reader: the forms rustfmt writes.
    let text = "use crate::service::execution::{a, b};\nuse crate::{http::guard, AppState};\n\
                let x = crate::mcp::route; // crate::serve in a comment\nuse crate::{\n    \
                config::{A, B},\n    keys,\n};";
    assert_eq!(
        crate_paths(&code(text)),
        ["service", "http", "AppState", "mcp", "config", "keys"]
    );
    assert!(!allowed("service", "http"));
    assert!(!allowed("http", "mcp"));
    assert!(!allowed("mcp", "http"));
    assert!(!allowed("keys", "service"));
    assert!(allowed("http", "http"));
    assert!(allowed("serve", "stdio"));
    assert!(allowed("audit", "store"));
    assert_eq!(reexports().get("app").map(String::as_str), Some("routes"));
}
