//! The `[tools]` section: the operator's MCP servers and the bounds on calls to them.
//!
//! A server's secrets (its environment, its HTTP headers) are never written here in clear:
//! each value names a host environment variable or a file, read when the server is started.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Code mode's settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ToolsConfig {
    /// The tool servers, by name (the module name inside the sandbox: `tools.<name>`).
    pub servers: BTreeMap<String, SourceConfig>,
    /// Calls one execution (or one session cell) may make.
    pub max_calls: u64,
    /// Calls of one execution running upstream at once; more wait their turn.
    pub max_concurrent: usize,
    /// Calls running on one server at once, all executions and keys together, shared fairly:
    /// a slot that comes free goes to the waiting key holding the fewest (`slots.rs`).
    pub max_concurrent_per_server: usize,
    /// Slots of each server that a key already calling it cannot take: kept for a key that
    /// holds none, so it is served at once while others keep the server busy. A key alone
    /// holds at most `max_concurrent_per_server` less these. Default: a quarter of
    /// `max_concurrent_per_server` (at least 1 when it is 2 or more); below it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved_per_server: Option<usize>,
    /// Longest a call waits for a slot of its server; past it, `ToolError` (`unavailable`).
    /// 0: a call never waits.
    pub slot_wait_ms: u64,
    /// Largest arguments of one call, as JSON.
    pub max_argument_bytes: u64,
    /// Largest result of one call; a larger one is a `ToolError`, never cut.
    pub max_result_bytes: u64,
    /// Time for one call, unless its server sets its own.
    pub call_timeout_ms: u64,
    /// Calls per minute per key, across all its executions; 0: no limit.
    pub rate_per_minute: u32,
    /// Time a server has to start and list its tools.
    pub start_timeout_ms: u64,
    /// Also write each call's arguments and result in the audit log (off: only their hash
    /// and sizes).
    pub audit_arguments: bool,
    /// Time a call that needs an approval (a server's `approval`) waits for one; past it the
    /// call fails as `ToolError(kind="timeout")`. The execution's wall clock runs meanwhile.
    pub approval_timeout_ms: u64,
    /// The most of a call's arguments (JSON bytes) an approval shows whole; larger ones are
    /// shown as their start, their size and their SHA-256.
    pub approval_shown_bytes: u64,
}

impl Default for ToolsConfig {
    fn default() -> Self {
        ToolsConfig {
            servers: BTreeMap::new(),
            max_calls: 100,
            max_concurrent: 4,
            max_concurrent_per_server: 16,
            reserved_per_server: None,
            slot_wait_ms: 1000,
            max_argument_bytes: 64 * 1024,
            max_result_bytes: 1024 * 1024,
            call_timeout_ms: 30_000,
            rate_per_minute: 600,
            start_timeout_ms: 15_000,
            audit_arguments: false,
            approval_timeout_ms: 120_000,
            approval_shown_bytes: 16 * 1024,
        }
    }
}

/// One MCP server: a command airlock starts (stdio), or a URL (streamable HTTP).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SourceConfig {
    /// stdio: the program, started with `args` and only the environment in `env`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<PathBuf>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// stdio: the server's whole environment (nothing of airlock's own is passed).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, Secret>,
    /// stdio: the directory it starts in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// Streamable HTTP: the endpoint (`http://127.0.0.1:9000/mcp`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Streamable HTTP: headers sent with every request.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, Secret>,
    /// Time for one call to this server; default `call_timeout_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_timeout_ms: Option<u64>,
    /// Which of its tools wait for an approval before each call: `"required"` (every tool),
    /// `"none"` (the default), or a list of tool names and `*` patterns.
    #[serde(skip_serializing_if = "ApprovalRule::is_none")]
    pub approval: ApprovalRule,
}

/// A server's `approval`: which of its tools need an approval before each call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ApprovalRule {
    #[default]
    None,
    /// Every tool of the server.
    All,
    /// The tools named, or matched by a `*` pattern (names compared exactly).
    Tools(Vec<String>),
}

impl ApprovalRule {
    pub fn is_none(&self) -> bool {
        *self == ApprovalRule::None
    }

    /// Whether a call to `tool` waits for an approval.
    pub fn requires(&self, tool: &str) -> bool {
        match self {
            ApprovalRule::None => false,
            ApprovalRule::All => true,
            ApprovalRule::Tools(patterns) => patterns.iter().any(|p| crate::grants::glob(p, tool)),
        }
    }
}

impl Serialize for ApprovalRule {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ApprovalRule::None => s.serialize_str("none"),
            ApprovalRule::All => s.serialize_str("required"),
            ApprovalRule::Tools(patterns) => patterns.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for ApprovalRule {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Rule;
        const EXPECTED: &str = "\"required\", \"none\", or a list of tool names and `*` patterns";
        impl<'de> serde::de::Visitor<'de> for Rule {
            type Value = ApprovalRule;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(EXPECTED)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ApprovalRule, E> {
                match v {
                    "required" => Ok(ApprovalRule::All),
                    "none" => Ok(ApprovalRule::None),
                    other => Err(E::custom(format!(
                        "approval {other:?}: expected {EXPECTED}"
                    ))),
                }
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<ApprovalRule, A::Error> {
                let mut patterns = Vec::new();
                while let Some(p) = seq.next_element::<String>()? {
                    patterns.push(p);
                }
                Ok(ApprovalRule::Tools(patterns))
            }
        }
        d.deserialize_any(Rule)
    }
}

/// Where a value comes from: a host environment variable, or a file (its contents, without
/// a final newline). Exactly one of the two.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Secret {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
}

impl Secret {
    /// The value, read now. Errors name the source, never the value.
    pub fn read(&self) -> Result<String, String> {
        match (&self.env, &self.file) {
            (Some(var), None) => std::env::var(var).map_err(|e| match e {
                std::env::VarError::NotPresent => {
                    format!("the environment variable {var} is not set")
                }
                std::env::VarError::NotUnicode(_) => {
                    format!("the environment variable {var} is not UTF-8")
                }
            }),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                Ok(text.strip_suffix('\n').unwrap_or(&text).to_owned())
            }
            _ => Err("a value must name exactly one of `env` or `file`".into()),
        }
    }
}

/// Python's keywords: never a module, function or parameter name.
pub(crate) const PYTHON_KEYWORDS: [&str; 35] = [
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

/// An ASCII identifier that is not a keyword.
pub(crate) fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
        && !PYTHON_KEYWORDS.contains(&name)
}

impl ToolsConfig {
    /// Slots of each server kept for keys that hold none of them: `reserved_per_server`, or
    /// a quarter of the slots (at least 1 when there are 2 or more).
    pub fn reserve(&self) -> usize {
        let total = self.max_concurrent_per_server;
        self.reserved_per_server
            .unwrap_or(if total >= 2 { (total / 4).max(1) } else { 0 })
    }

    /// Checks what can be checked before anything starts.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("max_calls", self.max_calls),
            ("max_concurrent", self.max_concurrent as u64),
            (
                "max_concurrent_per_server",
                self.max_concurrent_per_server as u64,
            ),
            ("max_argument_bytes", self.max_argument_bytes),
            ("max_result_bytes", self.max_result_bytes),
            ("call_timeout_ms", self.call_timeout_ms),
            ("start_timeout_ms", self.start_timeout_ms),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("tools.{name} must be at least 1"));
        }
        if let Some(reserved) = self.reserved_per_server {
            if reserved >= self.max_concurrent_per_server {
                return Err(format!(
                    "tools.reserved_per_server ({reserved}) must be below \
                     tools.max_concurrent_per_server ({}): a key must be able to call",
                    self.max_concurrent_per_server
                ));
            }
        }
        // An MCP message over stdio is one line of at most 16 MiB (rmcp drops longer ones),
        // and JSON may double a result's bytes.
        if self.approval_timeout_ms == 0 {
            return Err("tools.approval_timeout_ms must be at least 1".into());
        }
        if !(1..=1 << 20).contains(&self.approval_shown_bytes) {
            return Err("tools.approval_shown_bytes must be between 1 and 1048576".into());
        }
        if self.max_argument_bytes > 8 << 20 || self.max_result_bytes > 8 << 20 {
            return Err(
                "tools.max_argument_bytes and tools.max_result_bytes are at most 8 MiB".into(),
            );
        }
        for (name, source) in &self.servers {
            let at = format!("tools.servers.{name}");
            if !is_identifier(name) || name.starts_with('_') || RESERVED.contains(&name.as_str()) {
                return Err(format!(
                    "{at}: a server's name is its module name inside the sandbox: a Python \
                     identifier, not a keyword, not starting with `_`, not one of {RESERVED:?}"
                ));
            }
            match (&source.command, &source.url) {
                (Some(_), None) => {
                    if !source.headers.is_empty() {
                        return Err(format!("{at}: `headers` are for `url` servers"));
                    }
                }
                (None, Some(url)) => {
                    let Some(rest) = url
                        .strip_prefix("http://")
                        .or_else(|| url.strip_prefix("https://"))
                    else {
                        return Err(format!("{at}: `url` must be http:// or https://"));
                    };
                    // Credentials go in `headers`, read from the host, never in the URL.
                    let authority = rest.split('/').next().unwrap_or("");
                    if authority.contains('@') || url.contains('?') || url.contains('#') {
                        return Err(format!(
                            "{at}: `url` may not hold a user, password, query or fragment; \
                             put credentials in `headers` (from a host variable or file)"
                        ));
                    }
                    if !source.env.is_empty() || !source.args.is_empty() || source.cwd.is_some() {
                        return Err(format!(
                            "{at}: `env`, `args` and `cwd` are for `command` servers"
                        ));
                    }
                }
                _ => return Err(format!("{at}: needs exactly one of `command` or `url`")),
            }
            for (var, secret) in source.env.iter().chain(&source.headers) {
                if secret.env.is_some() == secret.file.is_some() {
                    return Err(format!(
                        "{at}: {var} must name exactly one of `env` (a host environment \
                         variable) or `file`; values are never written here in clear"
                    ));
                }
            }
            if source.call_timeout_ms == Some(0) {
                return Err(format!("{at}.call_timeout_ms must be at least 1"));
            }
            if let ApprovalRule::Tools(patterns) = &source.approval {
                if patterns.is_empty() {
                    return Err(format!(
                        "{at}.approval: an empty list requires nothing; write \"none\" if \
                         that is meant, or name the tools"
                    ));
                }
                if patterns.iter().any(String::is_empty) {
                    return Err(format!(
                        "{at}.approval: an empty name; list the tools' own names (`*` \
                         matches any characters)"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Names the `tools` package itself uses.
pub(crate) const RESERVED: [&str; 2] = ["search", "ToolError"];

#[cfg(test)]
mod tests {
    use super::*;

    fn stdio() -> SourceConfig {
        SourceConfig {
            command: Some("/usr/bin/true".into()),
            ..SourceConfig::default()
        }
    }

    #[test]
    fn bad_configs_are_named() {
        let with = |name: &str, s: SourceConfig| ToolsConfig {
            servers: [(name.to_owned(), s)].into(),
            ..ToolsConfig::default()
        };
        assert!(with("crm", stdio()).validate().is_ok());
        for name in ["class", "search", "_x", "a-b", "1a", ""] {
            assert!(with(name, stdio()).validate().is_err(), "{name}");
        }
        let both = SourceConfig {
            url: Some("http://x".into()),
            ..stdio()
        };
        assert!(with("crm", both)
            .validate()
            .unwrap_err()
            .contains("exactly one"));
        let clear = SourceConfig {
            env: [("TOKEN".into(), Secret::default())].into(),
            ..stdio()
        };
        assert!(with("crm", clear)
            .validate()
            .unwrap_err()
            .contains("in clear"));
        let zero = ToolsConfig {
            max_calls: 0,
            ..ToolsConfig::default()
        };
        assert!(zero.validate().unwrap_err().contains("max_calls"));
        let all_reserved = ToolsConfig {
            max_concurrent_per_server: 4,
            reserved_per_server: Some(4),
            ..ToolsConfig::default()
        };
        assert!(all_reserved
            .validate()
            .unwrap_err()
            .contains("reserved_per_server"));
    }

    #[test]
    fn approval_is_required_none_or_names_and_patterns() {
        #[derive(serde::Deserialize)]
        struct S {
            approval: ApprovalRule,
        }
        let rule = |v: serde_json::Value| {
            serde_json::from_value::<S>(serde_json::json!({ "approval": v }))
                .map(|s| s.approval)
                .map_err(|e| e.to_string())
        };
        assert_eq!(rule("required".into()), Ok(ApprovalRule::All));
        assert_eq!(rule("none".into()), Ok(ApprovalRule::None));
        let some = rule(serde_json::json!(["update_ticket", "delete_*"])).unwrap();
        assert!(some.requires("update_ticket") && some.requires("delete_row"));
        assert!(!some.requires("update_tickets") && !some.requires("Update_ticket"));
        assert!(ApprovalRule::All.requires("anything") && !ApprovalRule::None.requires("x"));
        assert!(rule("maybe".into())
            .unwrap_err()
            .contains("\"required\", \"none\""));
        assert!(rule(serde_json::json!(true)).is_err());
        let with = |approval| ToolsConfig {
            servers: [(
                "crm".to_owned(),
                SourceConfig {
                    approval,
                    ..stdio()
                },
            )]
            .into(),
            ..ToolsConfig::default()
        };
        assert!(with(ApprovalRule::Tools(vec![]))
            .validate()
            .unwrap_err()
            .contains("empty list"));
        assert!(with(ApprovalRule::Tools(vec!["".into()]))
            .validate()
            .is_err());
        assert!(with(some).validate().is_ok());
        let zero = ToolsConfig {
            approval_timeout_ms: 0,
            ..ToolsConfig::default()
        };
        assert!(zero.validate().unwrap_err().contains("approval_timeout_ms"));
    }

    #[test]
    fn a_quarter_of_a_servers_slots_is_reserved_unless_set() {
        let with = |total, reserved| ToolsConfig {
            max_concurrent_per_server: total,
            reserved_per_server: reserved,
            ..ToolsConfig::default()
        };
        assert_eq!(with(16, None).reserve(), 4);
        assert_eq!(with(4, None).reserve(), 1);
        assert_eq!(with(2, None).reserve(), 1);
        assert_eq!(with(1, None).reserve(), 0);
        assert_eq!(with(16, Some(0)).reserve(), 0);
        assert_eq!(with(16, Some(15)).reserve(), 15);
        assert!(with(16, Some(15)).validate().is_ok());
    }

    #[test]
    fn secrets_name_their_source_never_their_value() {
        let missing = Secret {
            env: Some("AIRLOCK_TEST_SURELY_UNSET".into()),
            file: None,
        };
        assert!(missing
            .read()
            .unwrap_err()
            .contains("AIRLOCK_TEST_SURELY_UNSET"));
        let dir = std::env::temp_dir().join(format!("airlock-secret-{}", std::process::id()));
        std::fs::write(&dir, "s3cret\n").unwrap();
        let file = Secret {
            env: None,
            file: Some(dir.clone()),
        };
        assert_eq!(file.read().unwrap(), "s3cret");
        std::fs::remove_file(&dir).unwrap();
        assert!(!file.read().unwrap_err().contains("s3cret"));
    }
}
