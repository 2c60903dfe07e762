//! The syscall filter, kept as data: `seccomp/x86_64.json`, one entry per syscall with the reason
//! it is there (the format is seccompiler's, as in firecracker's `resources/seccomp`).
//!
//! The file holds several filters that are all installed; the kernel runs every one on each call
//! and the most severe answer wins, so a later filter (the program's own included) can only add
//! restrictions:
//! - `allow`: the default-deny allow-list; any other call fails with `ENOSYS`.
//! - `kill`: calls only an escape attempt makes; the process is killed with `SIGSYS`.
//! - `noop`: durability and cache calls answered with success without running (the writable
//!   file system is a tmpfs; on the read-only host files they would reach the host's disk).
//! - `refused_flags`: `O_DIRECT`, directory notifications, leases and `RWF_NOWAIT` (EINVAL).
//! - `protect_init`: calls that would reach the sandbox's init by pid (EPERM).
//! - `socket_families`, `socket_types`, `socket_protocols`: only local sockets and TCP/UDP,
//!   never raw, each refusal with its own errno.
//! - `no_setns`: joining namespaces kills the process. Alone and last because a zygote's
//!   child joins its jail's namespaces: the zygote installs every other filter once, its
//!   children inherit them and add only this one ([`Filters::install_inherited`],
//!   [`Filters::install_last`]). A cold sandbox installs all of them, in the same order.
//!
//! Before those, a hand-written guard checks the architecture and kills on x32 syscall numbers
//! (`nr & 0x4000_0000`), which would otherwise reach the x86_64 table under another number.

use seccompiler::{sock_filter, BpfProgram, TargetArch};

/// The profile source for the architecture this crate was built for.
#[cfg(target_arch = "x86_64")]
pub const PROFILE_JSON: &str = include_str!("../seccomp/x86_64.json");
#[cfg(not(target_arch = "x86_64"))]
pub const PROFILE_JSON: &str = "";

/// Installation order. The kernel runs every filter and the most severe answer wins; among
/// errno answers the most recently installed filter wins. So `allow` comes after the filters
/// that refuse some forms of calls it allows (an errno beats its "allow" anyway), and `noop`
/// (success without running) comes after `allow`, whose ENOSYS it must beat for the calls
/// `allow` leaves out. A wrong socket family (EAFNOSUPPORT) outranks a raw type (EPERM),
/// which outranks a protocol (EPROTONOSUPPORT).
const FILTERS: [&str; 9] = [
    "kill",
    "refused_flags",
    "protect_init",
    "socket_protocols",
    "socket_types",
    "socket_families",
    "allow",
    "noop",
    "no_setns",
];

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("no seccomp profile for this architecture ({0})")]
    UnsupportedArch(&'static str),
    #[error("seccomp profile is malformed: {0}")]
    Profile(String),
    #[error("compiling seccomp profile: {0}")]
    Compile(#[from] seccompiler::Error),
    #[error("installing seccomp filter {name}: {source}")]
    Install {
        name: &'static str,
        source: seccompiler::Error,
    },
}

/// The compiled filters, in installation order.
#[derive(Debug)]
pub struct Filters(Vec<(&'static str, BpfProgram)>);

/// The filters compiled once for this process (see [`Filters::shared`]).
static SHARED: std::sync::OnceLock<Result<Filters, String>> = std::sync::OnceLock::new();

impl Filters {
    /// The embedded profile, compiled the first time this process asks: a host compiles it
    /// once and hands the programs to each sandbox's init (`encode`), which installs them.
    pub fn shared() -> Result<&'static Filters, SeccompError> {
        SHARED
            .get_or_init(|| Filters::compile().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| SeccompError::Profile(e.clone()))
    }

    /// The programs, in order, as bytes: per program its length, then each instruction
    /// (code, jt, jf, k; little-endian).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&(self.0.len() as u32).to_le_bytes());
        for (_, prog) in &self.0 {
            out.extend_from_slice(&(prog.len() as u32).to_le_bytes());
            for i in prog {
                out.extend_from_slice(&i.code.to_le_bytes());
                out.extend_from_slice(&[i.jt, i.jf]);
                out.extend_from_slice(&i.k.to_le_bytes());
            }
        }
        out
    }

    /// What `encode` wrote, for the filters this crate installs (their names are its own).
    pub(crate) fn decode(bytes: &[u8]) -> Result<Filters, SeccompError> {
        let bad = || SeccompError::Profile("the compiled filters are malformed".into());
        let mut at = 0;
        let u32_at = |at: &mut usize| -> Result<u32, SeccompError> {
            let b = bytes.get(*at..*at + 4).ok_or_else(bad)?;
            *at += 4;
            Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        let names: Vec<&'static str> = std::iter::once("arch_and_x32").chain(FILTERS).collect();
        if u32_at(&mut at)? as usize != names.len() {
            return Err(bad());
        }
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let n = u32_at(&mut at)? as usize;
            let body = bytes
                .get(at..at + n.checked_mul(8).ok_or_else(bad)?)
                .ok_or_else(bad)?;
            at += n * 8;
            let prog = body
                .chunks_exact(8)
                .map(|c| sock_filter {
                    code: u16::from_le_bytes([c[0], c[1]]),
                    jt: c[2],
                    jf: c[3],
                    k: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
                })
                .collect();
            out.push((name, prog));
        }
        if at != bytes.len() {
            return Err(bad());
        }
        Ok(Filters(out))
    }

    /// Compiles the embedded profile. Unknown syscall names are an error, never skipped.
    pub fn compile() -> Result<Self, SeccompError> {
        let arch = target_arch()?;
        let stripped = strip_filter_comments(PROFILE_JSON)?;
        let mut map = seccompiler::compile_from_json(stripped.as_bytes(), arch)?;
        let mut out = vec![("arch_and_x32", x32_guard())];
        for name in FILTERS {
            let prog = map
                .remove(name)
                .ok_or_else(|| SeccompError::Profile(format!("filter {name:?} is missing")))?;
            out.push((name, prog));
        }
        if let Some(extra) = map.keys().next() {
            return Err(SeccompError::Profile(format!(
                "unexpected filter {extra:?}"
            )));
        }
        Ok(Filters(out))
    }

    /// Installs every filter on the calling thread. `no_new_privs` must already be set.
    pub fn install(&self) -> Result<(), SeccompError> {
        self.install_inherited()?;
        self.install_last()
    }

    /// Every filter but the last (`no_setns`): what a zygote installs for its children.
    pub fn install_inherited(&self) -> Result<(), SeccompError> {
        Self::apply(&self.0[..self.0.len() - 1])
    }

    /// The last filter (`no_setns`), once a zygote's child has joined its jail.
    pub fn install_last(&self) -> Result<(), SeccompError> {
        Self::apply(&self.0[self.0.len() - 1..])
    }

    fn apply(filters: &[(&'static str, BpfProgram)]) -> Result<(), SeccompError> {
        for (name, prog) in filters {
            seccompiler::apply_filter(prog)
                .map_err(|source| SeccompError::Install { name, source })?;
        }
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn target_arch() -> Result<TargetArch, SeccompError> {
    if cfg!(target_arch = "x86_64") {
        Ok(TargetArch::x86_64)
    } else {
        Err(SeccompError::UnsupportedArch(std::env::consts::ARCH))
    }
}

/// seccompiler refuses unknown fields at filter level, where the profile keeps a comment per
/// filter; every rule must carry one too.
fn strip_filter_comments(json: &str) -> Result<String, SeccompError> {
    let bad = |m: String| SeccompError::Profile(m);
    let mut doc: serde_json::Value = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
    let filters = doc
        .as_object_mut()
        .ok_or_else(|| bad("top level is not an object".into()))?;
    for (name, filter) in filters.iter_mut() {
        let filter = filter
            .as_object_mut()
            .ok_or_else(|| bad(format!("{name} not an object")))?;
        let comment = filter.remove("comment");
        if comment
            .as_ref()
            .and_then(|c| c.as_str())
            .is_none_or(str::is_empty)
        {
            return Err(bad(format!("filter {name} has no comment")));
        }
        let rules = filter
            .get("filter")
            .and_then(|r| r.as_array())
            .ok_or_else(|| bad(format!("filter {name} has no rule list")))?;
        for rule in rules {
            let has_reason = rule
                .get("comment")
                .and_then(|c| c.as_str())
                .is_some_and(|c| !c.is_empty());
            if !has_reason {
                return Err(bad(format!("a rule of {name} has no reason: {rule}")));
            }
        }
    }
    Ok(doc.to_string())
}

/// Kill on a foreign architecture or an x32 syscall number.
fn x32_guard() -> BpfProgram {
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const JSET_K: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    let ins = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    vec![
        ins(LD_W_ABS, 0, 0, 4), // seccomp_data.arch
        ins(JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        ins(RET_K, 0, 0, libc::SECCOMP_RET_KILL_PROCESS),
        ins(LD_W_ABS, 0, 0, 0), // seccomp_data.nr
        ins(JSET_K, 0, 1, X32_SYSCALL_BIT),
        ins(RET_K, 0, 0, libc::SECCOMP_RET_KILL_PROCESS),
        ins(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ]
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn profile() -> serde_json::Value {
        serde_json::from_str(PROFILE_JSON).unwrap()
    }

    fn names(filter: &str) -> Vec<String> {
        profile()[filter]["filter"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["syscall"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn profile_compiles_with_every_filter() {
        let filters = Filters::compile().unwrap();
        assert_eq!(filters.len(), 1 + FILTERS.len());
    }

    #[test]
    fn allow_list_is_default_deny_and_kill_list_kills() {
        let p = profile();
        assert_eq!(
            p["allow"]["mismatch_action"],
            serde_json::json!({"errno": libc::ENOSYS})
        );
        assert_eq!(p["allow"]["filter_action"], "allow");
        assert_eq!(p["kill"]["filter_action"], "kill_process");
        assert_eq!(p["kill"]["mismatch_action"], "allow");
    }

    #[test]
    fn compiled_filters_cross_to_the_init_unchanged() {
        let filters = Filters::compile().unwrap();
        let back = Filters::decode(&filters.encode()).unwrap();
        assert_eq!(back.0.len(), filters.0.len());
        for ((a, pa), (b, pb)) in filters.0.iter().zip(&back.0) {
            assert_eq!(a, b);
            assert_eq!(pa, pb);
        }
        let bytes = filters.encode();
        assert!(Filters::decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(Filters::decode(&[bytes.as_slice(), &[0]].concat()).is_err());
        assert!(Filters::decode(&[]).is_err());
    }

    #[test]
    fn dangerous_calls_are_never_allowed_and_always_killed() {
        let allowed = names("allow");
        let killed = names("kill");
        for call in [
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
            "keyctl",
            "add_key",
            "bpf",
            "perf_event_open",
            "userfaultfd",
            "io_uring_setup",
            "io_uring_enter",
            "kexec_load",
            "init_module",
            "finit_module",
            "mount",
            "umount2",
            "pivot_root",
            "unshare",
            "open_by_handle_at",
            "move_mount",
            "fsopen",
            "chroot",
        ] {
            assert!(!allowed.contains(&call.to_owned()), "{call} is allowed");
            assert!(killed.contains(&call.to_owned()), "{call} is not killed");
        }
        assert!(
            !allowed.contains(&"clone3".to_owned()),
            "clone3 flags cannot be inspected"
        );
        // setns is allowed by `allow` only so that a zygote and its children can run under
        // every other filter: `no_setns`, installed last everywhere, kills it, and nothing else.
        assert_eq!(names("no_setns"), ["setns"]);
        assert_eq!(profile()["no_setns"]["filter_action"], "kill_process");
        assert_eq!(FILTERS.last(), Some(&"no_setns"));
        let filters = Filters::compile().unwrap();
        assert_eq!(filters.0.last().map(|f| f.0), Some("no_setns"));
    }

    #[test]
    fn no_syscall_is_both_conditional_and_unconditional_in_one_filter() {
        // seccompiler would silently turn such a pair into "conditional only".
        for (filter, body) in profile().as_object().unwrap() {
            let mut kinds: BTreeMap<String, (bool, bool)> = BTreeMap::new();
            for rule in body["filter"].as_array().unwrap() {
                let entry = kinds
                    .entry(rule["syscall"].as_str().unwrap().to_owned())
                    .or_default();
                if rule.get("args").is_some() {
                    entry.1 = true;
                } else {
                    entry.0 = true;
                }
            }
            for (name, (plain, cond)) in kinds {
                assert!(!(plain && cond), "{filter}: {name} is both");
            }
        }
    }

    #[test]
    fn noop_calls_are_left_out_of_the_allow_list_and_installed_after_it() {
        let allowed = names("allow");
        for call in names("noop") {
            assert!(
                !allowed.contains(&call),
                "{call} would run: it is in the allow list"
            );
        }
        let pos = |f: &str| FILTERS.iter().position(|x| *x == f).unwrap();
        assert!(pos("noop") > pos("allow"), "noop must beat allow's ENOSYS");
        assert_eq!(
            profile()["noop"]["filter_action"],
            serde_json::json!({"errno": 0})
        );
    }

    #[test]
    fn refining_filters_only_narrow_calls_the_allow_list_allows() {
        // Their errno beats "allow"; for a call `allow` leaves out, ENOSYS would compete.
        let allowed = names("allow");
        for filter in [
            "refused_flags",
            "protect_init",
            "socket_protocols",
            "socket_types",
            "socket_families",
        ] {
            for call in names(filter) {
                assert!(
                    allowed.contains(&call),
                    "{filter} narrows {call}, which is not allowed"
                );
            }
        }
    }

    #[test]
    fn rules_without_a_reason_are_refused() {
        let json = r#"{"allow": {"comment": "x", "mismatch_action": "allow",
            "filter_action": "allow", "filter": [{"syscall": "read"}]}}"#;
        assert!(matches!(
            strip_filter_comments(json),
            Err(SeccompError::Profile(_))
        ));
    }

    #[test]
    fn unknown_syscall_names_are_an_error() {
        let json = strip_filter_comments(
            r#"{"allow": {"comment": "x", "mismatch_action": "allow",
            "filter_action": "allow", "filter": [{"syscall": "no_such_call", "comment": "y"}]}}"#,
        )
        .unwrap();
        assert!(seccompiler::compile_from_json(json.as_bytes(), TargetArch::x86_64).is_err());
    }
}
