//! No two modules of the crate import each other, directly or around a longer circle: the
//! jail's steps are below both inits, and a zygote's processes below the host's side that
//! starts them. Each `.rs` file under `src/` is a module (`zygote/child.rs` is
//! `zygote::child`, a directory's `mod.rs` the directory itself), and every path outside
//! comments that names another counts, in `use` lines and inline alike: `crate::a::b`,
//! `super::x`, a module brought in by `use` and named later (`use crate::proto::{self, ..}`,
//! then `proto::send_msg`), and a directory's own submodules by their names. The crate root
//! only declares modules and re-exports their items: a name it re-exports stands for the
//! module it comes from.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

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

/// The module a file is (`zygote/child.rs` → `zygote::child`, `sys/mod.rs` → `sys`); the
/// crate root is "".
fn module_of(file: &Path) -> String {
    let rel = file.strip_prefix(src()).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts.join("::")
}

/// The text without comments (doc links may name any module).
fn code(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Every path in `code`, as its segments, with where it starts: `a::b::c`, and each path of
/// a group, `a::{b, c::{d, self}}` → `a::b`, `a::c::d`, `a::c::self`. A path starts at an
/// identifier that no `::` or identifier character comes right before.
fn paths(code: &str) -> Vec<(usize, Vec<String>)> {
    let chars: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts = ident_char(chars[i])
            && !chars[i].is_ascii_digit()
            && (i == 0 || !ident_char(chars[i - 1]))
            && !(i >= 2 && chars[i - 1] == ':' && chars[i - 2] == ':');
        if !starts {
            i += 1;
            continue;
        }
        let (tails, end) = path_at(&chars, i);
        found.extend(tails.into_iter().map(|tail| (i, tail)));
        i = end.max(i + 1);
    }
    found
}

/// The path (or paths, with groups) that starts at `i`, and where it ends.
fn path_at(chars: &[char], mut i: usize) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    loop {
        let start = i;
        while i < chars.len() && ident_char(chars[i]) {
            i += 1;
        }
        if i == start {
            break;
        }
        prefix.push(chars[start..i].iter().collect::<String>());
        let mut j = i;
        while j < chars.len() && chars[j].is_whitespace() {
            j += 1;
        }
        if !(j + 1 < chars.len() && chars[j] == ':' && chars[j + 1] == ':') {
            break;
        }
        j += 2;
        while j < chars.len() && chars[j].is_whitespace() {
            j += 1;
        }
        if j < chars.len() && chars[j] == '{' {
            let mut all = Vec::new();
            let mut k = j + 1;
            loop {
                while k < chars.len() && (chars[k].is_whitespace() || chars[k] == ',') {
                    k += 1;
                }
                if k >= chars.len() || chars[k] == '}' {
                    break;
                }
                let (tails, end) = path_at(chars, k);
                for tail in tails {
                    all.push(prefix.iter().cloned().chain(tail).collect());
                }
                // Past whatever follows the item (`as name`, `*`) to the next one.
                k = end.max(k + 1);
                let mut depth = 0;
                while k < chars.len() {
                    match chars[k] {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => break,
                        _ => {}
                    }
                    k += 1;
                }
            }
            return (all, k + 1);
        }
        i = j;
    }
    (vec![prefix], i)
}

/// The crate's modules and what each imports.
struct Crate {
    modules: BTreeSet<String>,
    /// Names the root re-exports, with the module each comes from.
    reexported: BTreeMap<String, String>,
}

impl Crate {
    fn new(modules: BTreeSet<String>, lib: &str) -> Crate {
        let mut reexported = BTreeMap::new();
        let lib = code(lib);
        let mut rest = lib.as_str();
        while let Some(i) = rest.find("pub use ") {
            rest = &rest[i + "pub use ".len()..];
            let chars: Vec<char> = rest.chars().collect();
            for path in path_at(&chars, 0).0 {
                if let (Some(first), Some(last)) = (path.first(), path.last()) {
                    reexported.insert(last.clone(), first.clone());
                }
            }
        }
        Crate {
            modules,
            reexported,
        }
    }

    fn join(&self, parent: &str, name: &str) -> String {
        if parent.is_empty() {
            name.to_owned()
        } else {
            format!("{parent}::{name}")
        }
    }

    /// The module `segments` reach from `from`, and whether they named a module to its end
    /// (so that its last segment names it).
    fn descend(&self, from: &str, segments: &[String]) -> (String, bool) {
        let mut at = from.to_owned();
        for (n, segment) in segments.iter().enumerate() {
            if segment == "self" {
                continue;
            }
            let next = self.join(&at, segment);
            if self.modules.contains(&next) {
                at = next;
            } else if at.is_empty() && n == 0 {
                match self.reexported.get(segment) {
                    Some(module) => return (module.clone(), false),
                    None => return (at, false), // an item of the root itself
                }
            } else {
                return (at, false);
            }
        }
        (at, true)
    }

    /// The modules the file of module `module` imports.
    fn imports(&self, module: &str, text: &str) -> BTreeSet<String> {
        // Declaring a submodule (`mod x;`) imports nothing, nor does a visibility
        // (`pub(super)`) name a module.
        let code: String = code(text)
            .replace("pub(crate)", "pub")
            .replace("pub(super)", "pub")
            .lines()
            .filter(|l| {
                let l = l.trim();
                let l = ["pub "].iter().find_map(|p| l.strip_prefix(p)).unwrap_or(l);
                !(l.starts_with("mod ") && l.ends_with(';'))
            })
            .collect::<Vec<_>>()
            .join("\n");
        // `super` in a `mod tests` is the file's own module.
        let tests_at = code
            .find("mod tests {")
            .map_or(usize::MAX, |i| code[..i].chars().count());
        let parent = module.rsplit_once("::").map_or("", |(p, _)| p);
        let mut aliases: BTreeMap<String, String> = BTreeMap::new();
        // A directory's `mod.rs` names its submodules as they are.
        for m in &self.modules {
            if let Some(child) = m.strip_prefix(&format!("{module}::")) {
                if !child.contains("::") && !module.is_empty() {
                    aliases.insert(child.to_owned(), m.clone());
                }
            }
        }
        let mut found = BTreeSet::new();
        for (at, path) in paths(&code) {
            let in_tests = at >= tests_at;
            {
                let Some((first, rest)) = path.split_first() else {
                    continue;
                };
                let (to, whole) = match first.as_str() {
                    "crate" => self.descend("", rest),
                    "super" if in_tests => self.descend(module, rest),
                    "super" => self.descend(parent, rest),
                    "self" => self.descend(module, rest),
                    // A module's name alone is no path (`child.id()` names a variable).
                    name => match aliases.get(name) {
                        Some(m) if !rest.is_empty() => self.descend(m, rest),
                        _ => continue,
                    },
                };
                if whole {
                    if let Some(name) = path.iter().rev().find(|s| *s != "self") {
                        aliases.insert(name.clone(), to.clone());
                    }
                }
                if !to.is_empty() && to != module {
                    found.insert(to);
                }
            }
        }
        found
    }
}

/// Every module's imports, read from the sources.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(&src(), &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(f)).collect();
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let krate = Crate::new(modules, &lib);
    files
        .iter()
        .filter_map(|file| {
            let module = module_of(file);
            let text = std::fs::read_to_string(file).unwrap();
            (!module.is_empty()).then(|| (module.clone(), krate.imports(&module, &text)))
        })
        .collect()
}

/// Each circle, once: for every import `a → b` from which `a` is reached again, the shortest
/// way back, as `a → b → ... → a`.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut seen: BTreeSet<BTreeSet<String>> = BTreeSet::new();
    let mut found = Vec::new();
    for (from, imports) in graph {
        for to in imports {
            // Breadth first from `to` back to `from`.
            let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
            let mut queue = VecDeque::from([to.as_str()]);
            let mut back = None;
            while let Some(at) = queue.pop_front() {
                if at == from {
                    back = Some(at);
                    break;
                }
                for next in graph.get(at).into_iter().flatten() {
                    if next != to && !came_from.contains_key(next.as_str()) {
                        came_from.insert(next, at);
                        queue.push_back(next);
                    }
                }
            }
            let Some(mut at) = back else { continue };
            let mut way = vec![at];
            while at != to {
                at = came_from[at];
                way.push(at);
            }
            way.push(from);
            way.reverse();
            let members: BTreeSet<String> = way.iter().map(|s| s.to_string()).collect();
            if seen.insert(members) {
                found.push(way.join(" → "));
            }
        }
    }
    found
}

#[test]
fn no_two_modules_import_each_other_in_a_circle() {
    let graph = graph();
    // The reader found the modules and their imports (an empty graph has no circle either).
    for (module, import) in [
        ("spawn", "cgroup"),
        ("zygote", "spawn"),
        ("sys::abi", "sys"),
    ] {
        assert!(
            graph.get(module).is_some_and(|i| i.contains(import)),
            "{module} should import {import}: {graph:#?}"
        );
    }
    let circles = circles(&graph);
    assert!(
        circles.is_empty(),
        "modules that import each other:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_reader_finds_what_it_must() {
    // The test above is only as good as this reader: the forms rustfmt writes, and comments.
    let modules: BTreeSet<String> = ["a", "b", "c", "d", "e", "z", "z::x", "z::y", "s"]
        .map(String::from)
        .into();
    let krate = Crate::new(
        modules,
        "mod a;\npub use b::{Thing, other};\npub use c::{\n    One,\n    Two,\n};\n",
    );
    let text = "use crate::a::{self, Item};\nuse crate::{\n    d::{D1, D2},\n    z::x,\n};\n\
                use super::Other; // crate::e in a comment\n\
                fn f() { a::call(); x::go(); crate::Thing::new(); crate::Two; std::io::stdin(); }\n\
                let s = y::not_a_module_here;\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n";
    let found = krate.imports("z::y", text);
    let expected: BTreeSet<String> = ["a", "b", "c", "d", "z", "z::x"].map(String::from).into();
    assert_eq!(found, expected);
    // A directory's own file names its submodules as they are; declaring one, a visibility
    // and a variable of the same name import nothing.
    let found = krate.imports(
        "z",
        "pub(crate) mod x;\nmod y;\nuse x::thing;\npub(super) fn g(x: u8) { y::call(); x.min(1); }\n",
    );
    assert_eq!(found, ["z::x", "z::y"].map(String::from).into());
    let found = krate.imports("z", "mod x;\npub(crate) mod y;\npub(super) struct S;\n");
    assert!(found.is_empty(), "{found:?}");
    // A circle, and only one, however many of its imports lead into it.
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c", "s"]),
        ("c", vec!["a"]),
        ("s", vec![]),
    ]
    .into_iter()
    .map(|(m, i)| (m.to_owned(), i.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(circles(&graph), ["a → b → c → a"]);
}
