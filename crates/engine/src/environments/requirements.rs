//! What an environment is asked for: its name and its requirements, each line checked to be
//! a plain PEP 508 requirement pip reads as such, and their content address.

use std::str::FromStr;

use sha2::{Digest, Sha256};

use super::error::EnvError;

/// Longest requirement list accepted, in lines and bytes.
pub const MAX_REQUIREMENTS: usize = 256;
pub const MAX_REQUIREMENTS_BYTES: usize = 64 * 1024;

/// Names: letters, digits, `-`, `_` and `.`, starting with a letter or digit.
pub fn check_name(name: &str) -> Result<(), EnvError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(EnvError::Invalid(format!(
            "environment name {name:?}: 1-64 letters, digits, '-', '_' or '.', starting with a letter or digit"
        )))
    }
}

/// A requirements file's lines, checked: each one a PEP 508 requirement of a name, extras, a
/// version specifier and a marker, nothing else (no options such as `--index-url`, `-i` or
/// `--global-option`, even after a marker; no URLs; no names pip takes for a local file, such as
/// `x.whl`), sorted and without duplicates. Blank lines and `#` comments are left out.
pub fn parse_requirements(text: &str) -> Result<Vec<String>, EnvError> {
    if text.len() > MAX_REQUIREMENTS_BYTES {
        return Err(EnvError::Invalid(format!(
            "requirements over {MAX_REQUIREMENTS_BYTES} bytes"
        )));
    }
    let mut out = Vec::new();
    for raw in text.lines() {
        let line = raw.split(" #").next().unwrap_or("").trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        check_requirement(line).map_err(|why| {
            EnvError::Invalid(format!(
                "requirement {line:?}: {why}; only `name[extras] <version specifiers> ; <marker>` (PEP 508, no options, URLs or paths)"
            ))
        })?;
        out.push(line.to_owned());
    }
    if out.is_empty() {
        return Err(EnvError::Invalid("no requirements".into()));
    }
    if out.len() > MAX_REQUIREMENTS {
        return Err(EnvError::Invalid(format!(
            "more than {MAX_REQUIREMENTS} requirements"
        )));
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// What pip takes for an archive file rather than a project name (`pip._internal.utils.
/// filetypes.ARCHIVE_EXTENSIONS`): `x.whl` alone installs the file `./x.whl`.
const ARCHIVE_SUFFIXES: [&str; 12] = [
    ".whl",
    ".zip",
    ".tar",
    ".tar.gz",
    ".tgz",
    ".tar.bz2",
    ".tbz",
    ".tar.xz",
    ".txz",
    ".tlz",
    ".tar.lz",
    ".tar.lzma",
];

/// One requirement line: parsed whole by a PEP 508 parser, and then narrower than PEP 508
/// where pip reads a line differently from the standard.
fn check_requirement(line: &str) -> Result<(), String> {
    // pip's requirements-file reader splits options off at a space followed by `-`, strips
    // `#` comments, expands `${VAR}` and joins lines ending in `\`; PEP 508 allows all of
    // these inside a marker's quoted string. None of them is needed to name a package.
    if let Some(c) = line
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || " \t-_.[],=<>!~;\"'()*".contains(*c)))
    {
        return Err(format!("the character {c:?} is not accepted"));
    }
    if line.split([' ', '\t']).any(|word| word.starts_with('-')) {
        return Err("options are not accepted".into());
    }
    let req = pep508_rs::Requirement::from_str(line).map_err(|e| {
        // The parser's message spans lines (the input and a caret under the fault).
        e.message.to_string()
    })?;
    if let Some(pep508_rs::VersionOrUrl::Url(_)) = req.version_or_url {
        return Err("URLs are not accepted".into());
    }
    let name = req.name.to_string().to_ascii_lowercase();
    let written = line
        .split(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        .next()
        .unwrap_or("")
        .to_ascii_lowercase();
    if ARCHIVE_SUFFIXES
        .iter()
        .any(|s| name.ends_with(s) || written.ends_with(s))
    {
        return Err("a name pip would take for a local archive file".into());
    }
    Ok(())
}

/// The content address of a build: the interpreter and the sorted requirements.
pub fn environment_hash(python: &str, requirements: &[String]) -> String {
    let mut h = Sha256::new();
    h.update(b"airlock-environment-v1\0");
    h.update(python.as_bytes());
    for r in requirements {
        h.update(b"\0");
        h.update(r.as_bytes());
    }
    airlock_api::hex(&h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requirements_are_specifiers_only_sorted() {
        assert_eq!(
            parse_requirements(
                "tabulate==0.9.0\n# comment\n\nattrs>=22 ; python_version>'3'\ntabulate==0.9.0\n"
            )
            .unwrap(),
            vec![
                "attrs>=22 ; python_version>'3'".to_owned(),
                "tabulate==0.9.0".to_owned()
            ]
        );
        for bad in [
            "--index-url http://evil/simple",
            "-e .",
            "pkg @ https://evil/pkg.whl",
            "./local.whl",
            "/etc/passwd",
            "",
            "# only a comment",
        ] {
            assert!(parse_requirements(bad).is_err(), "{bad}");
        }
        for good in [
            "tabulate",
            "Django~=4.2",
            "numpy!=1.0,<2",
            "requests[security,tests] >= 2.8.1, == 2.8.* ; python_version > \"3.8\"",
            "zope.interface==6.0 ; os_name == 'posix' and python_version >= '3.8'",
            "pkg (>=1.0)",
        ] {
            assert_eq!(parse_requirements(good).unwrap(), vec![good.to_owned()]);
        }
    }

    /// Issue 45: options, paths and files got past the old character check to pip.
    #[test]
    fn requirements_refuse_options_urls_and_files() {
        // The lines with options are not PEP 508 to begin with.
        for bad in [
            "tinypkg --global-option=--verbose --install-option=--no-compile",
            "pkg;os_name==\"posix\" -i x",
        ] {
            assert!(pep508_rs::Requirement::from_str(bad).is_err(), "{bad}");
        }
        for (bad, why) in [
            // Options after a name, after a marker, or inside one (pip's file reader splits
            // a line at a space followed by `-`).
            (
                "tinypkg --global-option=--verbose --install-option=--no-compile",
                "options",
            ),
            ("pkg;os_name==\"posix\" -i x", "options"),
            ("pkg ; os_name == \"posix -i x\"", "options"),
            ("pkg\t--hash=sha256:00", "options"),
            // pip installs these as local files.
            ("x.whl", "local archive file"),
            ("x.WHL[extra]", "local archive file"),
            ("x.tar.gz ; os_name == 'posix'", "local archive file"),
            ("x.zip==1.0", "local archive file"),
            // URLs and paths, in PEP 508's form or not.
            ("pkg @ https://evil.example/pkg.whl", "character"),
            ("pkg@file:///etc/passwd", "character"),
            ("./pkg", "character"),
            ("pkg ; os_name == \"${HOME}\"", "character"),
            ("pkg ; os_name == 'a#b'", "character"),
            ("pkg ; os_name == 'a #b'", "PEP 508"),
            // Not PEP 508: the parser refuses them.
            ("pkg ==", "PEP 508"),
            ("pkg >= 1 ; os_name", "PEP 508"),
            ("pkg[extra", "PEP 508"),
            ("pkg 1.0", "PEP 508"),
            ("pkg ; nonsense == 'x'", "PEP 508"),
            ("pkg >= 1 trailing", "PEP 508"),
        ] {
            let err = parse_requirements(bad).unwrap_err().to_string();
            // Named as read: a ` #` comment is left out first.
            let read = bad.split(" #").next().unwrap();
            assert!(err.contains(&format!("{read:?}")), "{bad}: {err}");
            if why != "PEP 508" {
                assert!(err.contains(why), "{bad}: {err}");
            }
        }
        for bad in ["", "-x", "a/b", "../x", "a b", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        assert!(check_name("datasci-2.0_x").is_ok());
    }

    #[test]
    fn the_hash_is_the_interpreter_and_the_sorted_requirements() {
        let a = environment_hash("3.11", &["a".into(), "b".into()]);
        assert_eq!(a, environment_hash("3.11", &["a".into(), "b".into()]));
        assert_ne!(a, environment_hash("3.12", &["a".into(), "b".into()]));
        assert_ne!(a, environment_hash("3.11", &["ab".into()]));
    }
}
