//! The layering rules of the crates' docs, checked on the sources of `airlock-server` and
//! `airlock-service`. Server: start-up → adapters → foundation, never back; among adapters
//! only `http` → `mcp` (the route table mounts MCP's HTTP transport). Service: services →
//! the state they share (`services`) → stores and foundation, never back. In both, no circle
//! among the top-level modules, nor among the submodules of `http/`, `mcp/`, `background/`,
//! `config/`, `pipeline/`, `store/` and `telemetry/`; and no transport in the service crate
//! (no path of axum, http, hyper, rmcp and their kin, and no such dependency in its
//! manifest); and in neither crate a read of the environment or of TOML (the binary reads the
//! configuration). Every `crate::` and `super::` path outside comments counts, in `use` lines
//! and inline alike.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One crate's modules and their layers (higher imports lower).
struct Crate {
    dir: &'static str,
    layers: &'static [(&'static str, u8)],
    /// The directories whose submodules must not import each other in a circle either.
    directories: &'static [&'static str],
}

const SERVER: Crate = Crate {
    dir: "server",
    layers: &[
        ("serve", START_UP),
        ("stdio", START_UP),
        ("http", ADAPTER),
        ("mcp", ADAPTER),
        ("openapi", FOUNDATION),
        ("sizing", FOUNDATION),
        ("wire", FOUNDATION),
    ],
    directories: &["http", "mcp"],
};

const SERVICE: Crate = Crate {
    dir: "service",
    layers: &[
        ("approvals", SERVICES),
        ("body", SERVICES),
        ("egress", SERVICES),
        ("environments", SERVICES),
        ("eval", SERVICES),
        ("execution", SERVICES),
        ("pickle", SERVICES),
        ("pipeline", SERVICES),
        ("sessions", SERVICES),
        ("snapshots", SERVICES),
        ("status", SERVICES),
        ("tools", SERVICES),
        ("volumes", SERVICES),
        ("services", SHARED),
        ("admission", FOUNDATION),
        ("answer", FOUNDATION),
        ("audit", FOUNDATION),
        ("audit_lines", FOUNDATION),
        ("background", FOUNDATION),
        ("budget", FOUNDATION),
        ("caller", FOUNDATION),
        ("config", FOUNDATION),
        ("credentials", FOUNDATION),
        ("error", FOUNDATION),
        ("keys", FOUNDATION),
        ("lifecycle", FOUNDATION),
        ("metrics", FOUNDATION),
        ("open_sessions", FOUNDATION),
        ("parked", FOUNDATION),
        ("paused", FOUNDATION),
        ("store", FOUNDATION),
        ("stream", FOUNDATION),
        ("telemetry", FOUNDATION),
    ],
    directories: &["background", "config", "pipeline", "store", "telemetry"],
};

const CRATES: [&Crate; 2] = [&SERVER, &SERVICE];

const START_UP: u8 = 3;
const ADAPTER: u8 = 2;
const SERVICES: u8 = 6;
const SHARED: u8 = 5;
const FOUNDATION: u8 = 0;

/// The one import between adapters the rule allows: the HTTP route table mounts MCP's
/// streamable HTTP transport, as `stdio.rs` mounts its stdio one. MCP never imports HTTP.
const ADAPTER_IMPORTS: &[(&str, &str)] = &[("http", "mcp")];

/// Crates that carry a transport: the services name none of their paths (requests, bodies,
/// status codes and responses are the adapters' to make).
const TRANSPORTS: &[&str] = &[
    "axum",
    "http",
    "http_body",
    "http_body_util",
    "hyper",
    "hyper_util",
    "rmcp",
    "tower",
];

impl Crate {
    fn src(&self) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(self.dir)
            .join("src")
    }

    fn layer(&self, module: &str) -> Option<u8> {
        self.layers
            .iter()
            .find(|(m, _)| *m == module)
            .map(|(_, l)| *l)
    }

    /// The rule: below, or the same module, or a peer in a layer whose peers may meet (all
    /// but the adapters, which meet only as [`ADAPTER_IMPORTS`] says).
    fn allowed(&self, from: &str, to: &str) -> bool {
        let (f, t) = (self.layer(from).unwrap(), self.layer(to).unwrap());
        t < f || from == to || (t == f && f != ADAPTER) || ADAPTER_IMPORTS.contains(&(from, to))
    }
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

/// Every source file of a crate, relative to its `src/`, with its text.
fn files(krate: &Crate) -> Vec<(PathBuf, String)> {
    let src = krate.src();
    let mut paths = Vec::new();
    sources(&src, &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p.strip_prefix(&src).unwrap().to_path_buf(), text)
        })
        .collect()
}

/// The top-level module a file belongs to (`service/sessions.rs` → `service`).
fn module_of(file: &Path) -> String {
    let first = file
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_str()
        .unwrap();
    first.trim_end_matches(".rs").to_owned()
}

/// The module a file is, as a node of the graphs: `service/sessions.rs` →
/// `service/sessions`, `service/mod.rs` → `service`, `config.rs` → `config`.
fn node_of(file: &Path) -> String {
    let text = file.with_extension("").to_str().unwrap().to_owned();
    text.strip_suffix("/mod").unwrap_or(&text).to_owned()
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

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Every path that a `prefix::` use-tree names, as its segments after the prefix:
/// `crate::a::{b, c::{d, e}}` → `[a, b]`, `[a, c, d]`, `[a, c, e]`.
fn paths_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(i) = code[at..].find(prefix) {
        let start = at + i;
        at = start + prefix.len();
        let before = code[..start].chars().next_back();
        if before.is_some_and(|c| is_ident(c) || c == '$' || c == ':') {
            continue; // `airlock_crate::`, `$crate::`, `a::super::`
        }
        tree(&code[at..], Vec::new(), &mut found);
    }
    found
}

/// Reads one use-tree at the start of `text`, below `prefix`; returns the text after it.
fn tree<'a>(text: &'a str, mut prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> &'a str {
    let mut rest = text.trim_start();
    loop {
        if let Some(mut inner) = rest.strip_prefix('{') {
            loop {
                inner = inner.trim_start();
                if let Some(after) = inner.strip_prefix('}') {
                    return after;
                }
                if inner.is_empty() {
                    return inner;
                }
                let before = inner.len();
                inner = tree(inner, prefix.clone(), out).trim_start();
                inner = inner.strip_prefix(',').unwrap_or(inner);
                if inner.len() == before {
                    inner = &inner[inner.chars().next().map_or(0, char::len_utf8)..];
                }
            }
        }
        if let Some(after) = rest.strip_prefix('*') {
            if !prefix.is_empty() {
                out.push(prefix);
            }
            return after;
        }
        let segment: String = rest.chars().take_while(|c| is_ident(*c)).collect();
        if segment.is_empty() {
            if !prefix.is_empty() {
                out.push(prefix);
            }
            return rest;
        }
        rest = rest[segment.len()..].trim_start();
        prefix.push(segment);
        if let Some(after) = rest.strip_prefix("::") {
            rest = after.trim_start();
            continue;
        }
        out.push(prefix);
        // `path as alias`: the alias names nothing new.
        if let Some(after) = rest.strip_prefix("as ") {
            let alias = after.trim_start();
            return &alias[alias.chars().take_while(|c| is_ident(*c)).count()..];
        }
        return rest;
    }
}

/// Names the crate root re-exports, with the module each comes from (`pub use a::b::{c, d}`).
fn reexports(krate: &Crate) -> BTreeMap<String, String> {
    let lib = code(&std::fs::read_to_string(krate.src().join("lib.rs")).unwrap());
    let mut names = BTreeMap::new();
    for line in lib.lines() {
        let Some(rest) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let mut paths = Vec::new();
        tree(rest, Vec::new(), &mut paths);
        for path in paths {
            names.insert(path.last().unwrap().clone(), path[0].clone());
        }
    }
    names
}

/// One import of one module by a file: the file, and the module (a node of the graphs) it
/// reaches.
struct Import {
    file: PathBuf,
    from: String,
    to: String,
}

/// Every import of a crate module, resolved to the node it reaches: the top-level module, or
/// for `service/` and `http/` the submodule (`crate::service::sessions::find` →
/// `service/sessions`; `super::stream` in `service/` → `service/stream`). Items of the crate
/// root itself (`AppState`, `SharedState`) are no module's.
fn imports(krate: &Crate) -> Vec<Import> {
    let all = files(krate);
    let nodes: BTreeSet<String> = all.iter().map(|(f, _)| node_of(f)).collect();
    let reexported = reexports(krate);
    let mut found = Vec::new();
    for (file, text) in &all {
        let from = node_of(file);
        if from == "lib" {
            continue; // the root only declares modules and holds the shared state
        }
        let code = code(text);
        let parent = from.rsplit_once('/').map(|(p, _)| p.to_owned());
        let mut targets: Vec<Vec<String>> = paths_after(&code, "crate::");
        if let Some(parent) = &parent {
            // Within a file's `mod tests`, `super::` is the file itself, not its parent.
            let outside_tests = code.split("#[cfg(test)]").next().unwrap_or("");
            for path in paths_after(outside_tests, "super::") {
                let mut full = vec![parent.clone()];
                full.extend(path);
                targets.push(full);
            }
        }
        for path in targets {
            let first = &path[0];
            let top = match reexported.get(first) {
                Some(module) => module.clone(),
                None if krate.layer(first).is_some() => first.clone(),
                None => continue,
            };
            let to = match path.get(1) {
                Some(sub) if top == *first && nodes.contains(&format!("{top}/{sub}")) => {
                    format!("{top}/{sub}")
                }
                _ => top,
            };
            found.push(Import {
                file: file.clone(),
                from: from.clone(),
                to,
            });
        }
    }
    found
}

fn top(node: &str) -> &str {
    node.split('/').next().unwrap()
}

/// Every import that breaks the rule, as `file: crate::x (layer) from module (layer)`.
fn violations(krate: &Crate) -> Vec<String> {
    let mut bad = Vec::new();
    for Import { file, from, to } in imports(krate) {
        let (from, to) = (top(&from), top(&to));
        if !krate.allowed(from, to) {
            bad.push(format!(
                "{}/{}: imports crate::{to} (layer {}) from {from} (layer {})",
                krate.dir,
                file.display(),
                krate.layer(to).unwrap(),
                krate.layer(from).unwrap()
            ));
        }
    }
    bad
}

/// A circle in `edges`, as the modules along it (the first again at the end), if any.
fn circle(edges: &BTreeSet<(String, String)>) -> Option<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges {
        if a != b {
            next.entry(a).or_default().push(b);
        }
    }
    // Depth first; a module met again while still on the path closes a circle.
    fn visit<'a>(
        node: &'a str,
        next: &BTreeMap<&'a str, Vec<&'a str>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|n| *n == node) {
            let mut found: Vec<String> = path[i..].iter().map(|n| (*n).to_owned()).collect();
            found.push(node.to_owned());
            return Some(found);
        }
        if !done.insert(node) {
            return None;
        }
        path.push(node);
        for n in next.get(node).into_iter().flatten() {
            if let Some(found) = visit(n, next, path, done) {
                return Some(found);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for start in next.keys() {
        if let Some(found) = visit(start, &next, &mut Vec::new(), &mut done) {
            return Some(found);
        }
    }
    None
}

/// Where each edge of a circle is made, for the failure's message.
fn witnesses(found: &[String], all: &[Import], level: fn(&str) -> String) -> String {
    found
        .windows(2)
        .map(|pair| {
            let file = all
                .iter()
                .find(|i| level(&i.from) == pair[0] && level(&i.to) == pair[1])
                .map_or_else(String::new, |i| i.file.display().to_string());
            format!("{} -> {} ({file})", pair[0], pair[1])
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Paths of a transport's crates in `code` (`axum::`, `use hyper;`), not those of the crate's
/// own modules (`crate::http::`).
fn transport_paths(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    for name in TRANSPORTS {
        for suffix in ["::", ";"] {
            let needle = format!("{name}{suffix}");
            for (i, _) in code.match_indices(&needle) {
                let before = code[..i].chars().next_back();
                if before.is_some_and(|c| is_ident(c) || c == ':') {
                    continue;
                }
                if suffix == ";" && !code[..i].trim_end().ends_with("use") {
                    continue;
                }
                found.push(format!("{name}{suffix}"));
            }
        }
    }
    found
}

#[test]
fn every_module_has_a_layer_and_every_layer_entry_a_module() {
    for krate in CRATES {
        let mut modules: Vec<String> = files(krate).iter().map(|(f, _)| module_of(f)).collect();
        modules.sort();
        modules.dedup();
        modules.retain(|m| m != "lib");
        let unplaced: Vec<&String> = modules
            .iter()
            .filter(|m| krate.layer(m).is_none())
            .collect();
        assert!(
            unplaced.is_empty(),
            "{}: modules without a layer: {unplaced:?}",
            krate.dir
        );
        let gone: Vec<&str> = krate
            .layers
            .iter()
            .map(|(m, _)| *m)
            .filter(|m| !modules.iter().any(|x| x == m))
            .collect();
        assert!(
            gone.is_empty(),
            "{}: the layers name modules that do not exist: {gone:?}",
            krate.dir
        );
    }
}

#[test]
fn no_module_imports_one_above_it_or_another_adapter() {
    let bad: Vec<String> = CRATES.iter().flat_map(|k| violations(k)).collect();
    assert!(
        bad.is_empty(),
        "imports against the layers:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_services_name_no_transport() {
    let mut found = Vec::new();
    for (file, text) in files(&SERVICE) {
        for path in transport_paths(&code(&text)) {
            found.push(format!("{}: {path}", file.display()));
        }
    }
    assert!(
        found.is_empty(),
        "transport paths in the services (requests, statuses and responses are the \
         adapters'):\n{}",
        found.join("\n")
    );
    // Nor can they: the manifest names none of those crates.
    let manifest = std::fs::read_to_string(SERVICE.src().join("..").join("Cargo.toml")).unwrap();
    let named: Vec<&str> = TRANSPORTS
        .iter()
        .copied()
        .filter(|t| {
            let dashed = t.replace('_', "-");
            manifest.lines().any(|l| {
                l.trim_start().starts_with(&format!("{dashed} "))
                    || l.trim_start().starts_with(&format!("{dashed}="))
            })
        })
        .collect();
    assert!(
        named.is_empty(),
        "the service crate depends on a transport: {named:?}"
    );
}

/// Only the binary reads configuration (the TOML file, `AIRLOCK_*` variables, the host's
/// places): the libraries take values. No source of either crate reads an environment
/// variable or parses TOML, and neither manifest names the `toml` crate.
#[test]
fn the_libraries_read_no_configuration() {
    let mut found = Vec::new();
    for krate in CRATES {
        for (file, text) in files(krate) {
            let code = code(&text);
            for needle in ["env::var", "toml::"] {
                if code.contains(needle) {
                    found.push(format!("{}/{}: {needle}", krate.dir, file.display()));
                }
            }
        }
        let manifest = std::fs::read_to_string(krate.src().join("..").join("Cargo.toml")).unwrap();
        if manifest.lines().any(|l| {
            let l = l.trim_start();
            l.starts_with("toml ") || l.starts_with("toml=")
        }) {
            found.push(format!("{}/Cargo.toml: toml", krate.dir));
        }
    }
    assert!(
        found.is_empty(),
        "configuration read in a library (crates/cli/src/config.rs reads it):\n{}",
        found.join("\n")
    );
}

#[test]
fn no_two_top_level_modules_import_each_other_in_a_circle() {
    for krate in CRATES {
        let all = imports(krate);
        let edges: BTreeSet<(String, String)> = all
            .iter()
            .map(|i| (top(&i.from).to_owned(), top(&i.to).to_owned()))
            .collect();
        if let Some(found) = circle(&edges) {
            panic!(
                "{}: top-level modules in a circle: {}\n{}",
                krate.dir,
                found.join(" -> "),
                witnesses(&found, &all, |n| top(n).to_owned())
            );
        }
    }
}

#[test]
fn no_two_submodules_of_a_directory_import_each_other_in_a_circle() {
    for krate in CRATES {
        let all = imports(krate);
        for dir in krate.directories {
            let inside = |n: &str| top(n) == *dir;
            let edges: BTreeSet<(String, String)> = all
                .iter()
                .filter(|i| inside(&i.from) && inside(&i.to))
                .map(|i| (i.from.clone(), i.to.clone()))
                .collect();
            if let Some(found) = circle(&edges) {
                panic!(
                    "{}/{dir}/ modules in a circle: {}\n{}",
                    krate.dir,
                    found.join(" -> "),
                    witnesses(&found, &all, str::to_owned)
                );
            }
        }
    }
}

#[test]
fn the_reader_finds_what_it_must() {
    // The checks above are only as good as this reader: the forms rustfmt writes.
    let text = "use crate::service::execution::{a, b};\nuse crate::{http::guard, AppState};\n\
                let x = crate::mcp::route; // crate::serve in a comment\nuse crate::{\n    \
                config::{A, B},\n    keys,\n};\nuse super::stream::{self, Events as E};\n\
                let y = airlock_crate::z;";
    let firsts: Vec<String> = paths_after(&code(text), "crate::")
        .into_iter()
        .map(|p| p[0].clone())
        .collect();
    assert_eq!(
        firsts,
        ["service", "service", "http", "AppState", "mcp", "config", "config", "keys"]
    );
    let supers = paths_after(&code(text), "super::");
    assert_eq!(supers[0], ["stream", "self"]);
    assert_eq!(supers[1], ["stream", "Events"]);
    assert!(!SERVER.allowed("wire", "http"));
    assert!(
        SERVER.allowed("http", "mcp"),
        "the route table mounts MCP's transport"
    );
    assert!(!SERVER.allowed("mcp", "http"));
    assert!(SERVER.allowed("http", "http"));
    assert!(SERVER.allowed("serve", "stdio"));
    assert!(!SERVICE.allowed("keys", "services"));
    assert!(!SERVICE.allowed("services", "sessions"));
    assert!(SERVICE.allowed("sessions", "services"));
    assert!(SERVICE.allowed("pipeline", "execution"));
    assert!(SERVICE.allowed("audit", "store"));
    assert_eq!(
        reexports(&SERVER).get("app").map(String::as_str),
        Some("http")
    );
    // A circle is found, and named in order; a tree has none.
    let edges = |pairs: &[(&str, &str)]| -> BTreeSet<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    };
    assert_eq!(
        circle(&edges(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")])),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    assert_eq!(circle(&edges(&[("a", "b"), ("a", "c"), ("b", "c")])), None);
    // A transport's paths are found; the crate's own `http` module is not one.
    let planted =
        "use axum::extract::Request;\nuse crate::http::guard;\nlet s = hyper::StatusCode;\n\
                   use http_body_util::BodyExt;\nfn f(r: http::Request<()>) {}\nuse rmcp;";
    assert_eq!(
        transport_paths(&code(planted)),
        ["axum::", "http::", "http_body_util::", "hyper::", "rmcp;"]
    );
}
