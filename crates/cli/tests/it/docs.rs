//! docs/architecture.md stays true as the code moves: its module table lists every source file
//! of the workspace's crates, Rust and Python (the runner, the zygote's Python), and no other,
//! and every function, type and constant it names by path (`execution::run_job`,
//! `Killer::kill_outer`, `STATUS_FD`) exists, in the module its path names.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn page() -> String {
    std::fs::read_to_string(root().join("docs/architecture.md")).unwrap()
}

/// Every file under `dir` with one of `extensions`.
fn files_in(dir: &Path, extensions: &[&str], out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_in(&path, extensions, out);
        } else if path
            .extension()
            .is_some_and(|e| extensions.iter().any(|x| e == *x))
        {
            out.push(path);
        }
    }
}

/// The source files with one of `extensions` under each crate's `src/`.
fn sources(extensions: &[&str]) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for krate in std::fs::read_dir(root().join("crates")).unwrap() {
        let src = krate.unwrap().path().join("src");
        if src.is_dir() {
            files_in(&src, extensions, &mut files);
        }
    }
    files
}

/// The spans between backticks.
fn quoted(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

#[test]
fn the_architecture_page_lists_every_module_and_no_other() {
    let root = root().canonicalize().unwrap();
    // Python too: the runner and the zygote's code are modules as much as the Rust around them.
    let present: BTreeSet<String> = sources(&["rs", "py"])
        .iter()
        .map(|p| {
            p.canonicalize()
                .unwrap()
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let page = page();
    let listed: BTreeSet<String> = page
        .lines()
        .filter(|l| l.starts_with("| `crates/"))
        .filter_map(|l| quoted(l).first().map(|s| (*s).to_owned()))
        .collect();
    let missing: Vec<_> = present.difference(&listed).collect();
    let stale: Vec<_> = listed.difference(&present).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "docs/architecture.md's module table: missing {missing:?}, no longer there {stale:?}"
    );
}

#[test]
fn every_function_type_and_constant_the_page_names_exists() {
    let files: Vec<(PathBuf, String)> = sources(&["rs"])
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect();
    let code: String = files.iter().map(|(_, t)| t.as_str()).collect();
    // The text of module `name`: `name.rs`, or everything under a `name/` directory.
    let module = |name: &str| -> Option<String> {
        let text: String = files
            .iter()
            .filter(|(p, _)| {
                p.file_stem().is_some_and(|s| s == name)
                    || p.components().any(|c| c.as_os_str() == name)
            })
            .map(|(_, t)| t.as_str())
            .collect();
        (!text.is_empty()).then_some(text)
    };
    let is_ident = |s: &str| {
        !s.is_empty()
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !s.starts_with(|c: char| c.is_ascii_digit())
    };
    let page = page();
    let mut checked = 0;
    let mut absent = Vec::new();
    for name in quoted(&page) {
        let parts: Vec<&str> = name.split("::").collect();
        if !parts.iter().all(|p| is_ident(p)) {
            continue;
        }
        let last = parts[parts.len() - 1];
        let constant = last.len() > 1
            && last.contains('_')
            && last.chars().all(|c| c.is_ascii_uppercase() || c == '_');
        // `module::item` is looked for in that module, which must exist; `Type::item` and
        // `airlock_crate::item` anywhere.
        let first = parts[0];
        let scope = if parts.len() > 1
            && first.starts_with(|c: char| c.is_ascii_lowercase())
            && !first.starts_with("airlock_")
        {
            match module(first) {
                Some(text) => text,
                None => {
                    absent.push(name);
                    continue;
                }
            }
        } else {
            code.clone()
        };
        let code = &scope;
        let found = if constant {
            code.contains(&format!("const {last}:")) || code.contains(last)
        } else if parts.len() < 2 {
            continue; // a lone lowercase word: prose as often as code
        } else if last.starts_with(|c: char| c.is_ascii_uppercase()) {
            ["struct", "enum", "trait", "type"]
                .iter()
                .any(|kind| code.contains(&format!("{kind} {last}")))
        } else {
            code.contains(&format!("fn {last}(")) || code.contains(&format!("fn {last}<"))
        };
        checked += 1;
        if !found {
            absent.push(name);
        }
    }
    assert!(checked >= 20, "only {checked} names checked");
    assert!(
        absent.is_empty(),
        "docs/architecture.md names what the code no longer has: {absent:?}"
    );
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens; a
/// repeated one gets `-1`, `-2`...
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        if fenced {
            continue;
        }
        let text = heading.trim_start_matches('#').trim().to_lowercase();
        let slug: String = text
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut unique = slug.clone();
        let mut n = 0;
        while seen.contains(&unique) {
            n += 1;
            unique = format!("{slug}-{n}");
        }
        seen.insert(unique);
    }
    seen
}

/// The targets of `[text](target)` links outside code blocks.
fn links(markdown: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            if let Some(end) = rest.find(')') {
                found.push(rest[..end].to_owned());
                rest = &rest[end..];
            }
        }
    }
    found
}

#[test]
fn every_link_in_the_docs_reaches_a_file_and_a_heading() {
    let root = root();
    let mut pages: Vec<PathBuf> = ["README.md", "DEVELOPERS.md", "BENCHMARKS.md", "SOAK.md"]
        .iter()
        .map(|p| root.join(p))
        .collect();
    pages.push(root.join("clients/python/README.md"));
    pages.push(root.join("clients/typescript/README.md"));
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        pages.push(entry.unwrap().path());
    }
    let mut checked = 0;
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let file = if path.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(path)
            };
            let name = page.strip_prefix(&root).unwrap().display().to_string();
            if !file.exists() {
                broken.push(format!("{name}: {target} (no such file)"));
                continue;
            }
            if !anchor.is_empty() {
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                if !anchors(&text).contains(anchor) {
                    broken.push(format!("{name}: {target} (no such heading)"));
                }
            }
        }
    }
    assert!(checked >= 100, "only {checked} links checked");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
