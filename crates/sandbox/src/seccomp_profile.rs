//! Compiling the seccomp profile from its JSON. `build.rs` runs this and embeds the programs
//! in the crate (`seccomp::Filters::compile` decodes them), so that no airlock process
//! compiles JSON at run time (about a millisecond, on every `airlock run`); the tests run it
//! again and check that the embedded programs are the profile's.

use seccompiler::{sock_filter, BpfProgram, TargetArch};

/// Installation order. The kernel runs every filter and the most severe answer wins; among
/// errno answers the most recently installed filter wins. So `allow` comes after the filters
/// that refuse some forms of calls it allows (an errno beats its "allow" anyway), and `noop`
/// (success without running) comes after `allow`, whose ENOSYS it must beat for the calls
/// `allow` leaves out. A wrong socket family (EAFNOSUPPORT) outranks a raw type (EPERM),
/// which outranks a protocol (EPROTONOSUPPORT).
pub const FILTERS: [&str; 10] = [
    "kill",
    "refused_flags",
    "protect_init",
    "socket_protocols",
    "socket_types",
    "socket_families",
    "allow",
    "noop",
    "no_clone3",
    "no_setns",
];

pub const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
pub const JA: u16 = 0x05; // BPF_JMP | BPF_JA
pub const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
pub const JGT_K: u16 = 0x25; // BPF_JMP | BPF_JGT | BPF_K
pub const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
pub const JSET_K: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
pub const AND_K: u16 = 0x54; // BPF_ALU | BPF_AND | BPF_K
pub const RET_K: u16 = 0x06; // BPF_RET | BPF_K
pub const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;

/// The profile's filters, compiled for x86_64, in installation order after the x32 guard.
/// Unknown syscall names are an error, never skipped.
pub fn compile_parts(json: &str) -> Result<Vec<(&'static str, BpfProgram)>, String> {
    let stripped = strip_filter_comments(json)?;
    let mut map = seccompiler::compile_from_json(stripped.as_bytes(), TargetArch::x86_64)
        .map_err(|e| format!("compiling seccomp profile: {e}"))?;
    let mut out = vec![("arch_and_x32", x32_guard())];
    for name in FILTERS {
        let prog = map
            .remove(name)
            .ok_or_else(|| format!("filter {name:?} is missing"))?;
        out.push((name, prog));
    }
    if let Some(extra) = map.keys().next() {
        return Err(format!("unexpected filter {extra:?}"));
    }
    Ok(out)
}

/// The programs, in order, as bytes: their count, then per program its length and each
/// instruction (code, jt, jf, k; little-endian).
pub fn encode(parts: &[(&'static str, BpfProgram)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(parts.len() as u32).to_le_bytes());
    for (_, prog) in parts {
        out.extend_from_slice(&(prog.len() as u32).to_le_bytes());
        for i in prog {
            out.extend_from_slice(&i.code.to_le_bytes());
            out.extend_from_slice(&[i.jt, i.jf]);
            out.extend_from_slice(&i.k.to_le_bytes());
        }
    }
    out
}

/// seccompiler refuses unknown fields at filter level, where the profile keeps a comment per
/// filter; every rule must carry one too.
pub fn strip_filter_comments(json: &str) -> Result<String, String> {
    let bad = |m: String| m;
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
pub fn x32_guard() -> BpfProgram {
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
