//! What a key may call: patterns `server.tool`, where `*` stands for any run of characters
//! (`crm.*`, `*.search_*`). A tool whose annotations do not say it is read-only is granted
//! only by a pattern that names it exactly, never by one with a `*`.

use std::collections::BTreeMap;

use crate::source::ToolInfo;

/// One key's grants.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grants {
    patterns: Vec<(String, String)>,
}

impl Grants {
    /// Parses `server.tool` patterns; errors name the bad one.
    pub fn parse<S: AsRef<str>>(patterns: &[S]) -> Result<Grants, String> {
        let mut parsed = Vec::with_capacity(patterns.len());
        for p in patterns {
            let p = p.as_ref();
            let Some((server, tool)) = p.split_once('.') else {
                return Err(format!(
                    "tool grant {p:?}: expected `server.tool` (`*` matches any characters)"
                ));
            };
            if server.is_empty() || tool.is_empty() {
                return Err(format!("tool grant {p:?}: both parts must be given"));
            }
            parsed.push((server.to_owned(), tool.to_owned()));
        }
        Ok(Grants { patterns: parsed })
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Whether `server.tool` is granted. Names are compared exactly, byte for byte.
    pub fn allows(&self, server: &str, tool: &str, read_only: bool) -> bool {
        self.patterns
            .iter()
            .any(|(s, t)| matches(s, t, server, tool, read_only))
    }

    /// Checks the grants against the servers' tools as they are now: a server that is not
    /// configured, or an exact name that is not a tool, is an error; a pattern that matches
    /// nothing is reported as a warning.
    pub fn check(
        &self,
        catalog: &BTreeMap<String, Vec<std::sync::Arc<ToolInfo>>>,
    ) -> Result<Vec<String>, String> {
        let mut warnings = Vec::new();
        for (s, t) in &self.patterns {
            let servers: Vec<_> = catalog.iter().filter(|(name, _)| glob(s, name)).collect();
            if servers.is_empty() {
                return Err(if s.contains('*') {
                    format!("tool grant `{s}.{t}` matches no configured server")
                } else {
                    format!("tool grant `{s}.{t}` names no configured server `{s}`")
                });
            }
            let exact = !s.contains('*') && !t.contains('*');
            let matched = servers.iter().any(|(server, tools)| {
                tools
                    .iter()
                    .any(|tool| matches(s, t, server, &tool.name, tool.read_only))
            });
            if exact
                && !servers
                    .iter()
                    .any(|(_, tools)| tools.iter().any(|x| &x.name == t))
            {
                let names: Vec<&str> = servers
                    .iter()
                    .flat_map(|(_, tools)| tools.iter().map(|x| x.name.as_str()))
                    .collect();
                return Err(format!(
                    "tool grant `{s}.{t}`: server `{s}` has no tool `{t}` (it has: {})",
                    names.join(", ")
                ));
            }
            if !matched {
                warnings.push(format!(
                    "tool grant `{s}.{t}` matches no read-only tool (a tool that may write is \
                     granted only by its exact name)"
                ));
            }
        }
        Ok(warnings)
    }
}

/// Whether one pattern grants `server.tool`: exactly, or by a glob if the tool is read-only.
fn matches(s: &str, t: &str, server: &str, tool: &str, read_only: bool) -> bool {
    if s.contains('*') || t.contains('*') {
        read_only && glob(s, server) && glob(t, tool)
    } else {
        s == server && t == tool
    }
}

/// `*` matches any run of characters (none included); everything else matches itself.
pub(crate) fn glob(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        for (p, n, m) in [
            ("*", "anything", true),
            ("find_*", "find_customer", true),
            ("find_*", "find_", true),
            ("find_*", "fin", false),
            ("*_customer", "find_customer", true),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "acb", false),
            ("ab*ba", "aba", false),
            ("exact", "exact", true),
            ("exact", "Exact", false),
        ] {
            assert_eq!(glob(p, n), m, "{p} {n}");
        }
    }

    #[test]
    fn writes_need_their_exact_name() {
        let g = Grants::parse(&["crm.*", "db.insert_row"]).unwrap();
        assert!(g.allows("crm", "find", true));
        assert!(
            !g.allows("crm", "delete", false),
            "a glob never reaches a write"
        );
        assert!(g.allows("db", "insert_row", false));
        assert!(!g.allows("db", "insert_rows", false));
        assert!(!g.allows("CRM", "find", true), "names are exact");
        // U+0441 CYRILLIC SMALL LETTER ES looks like "c".
        assert!(!g.allows("\u{441}rm", "find", true));
        assert!(!Grants::default().allows("crm", "find", true));
        assert!(Grants::parse(&["crm"]).is_err());
        assert!(Grants::parse(&[".x"]).is_err());
    }
}
