//! Files: a pickle, or a ZIP archive of them (PyTorch's `.pt`/`.pth`/`.ckpt`). Members are
//! found by their local headers wherever they are, not through the central directory, and a
//! pickle is recognised by its content, not its name: a bad CRC, odd flag bits or a
//! duplicate name hide nothing.

use std::collections::HashMap;

use crate::{Options, Report, Verdict};

/// One member of an archive.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    pub name: String,
    /// Offset of its local header in the file.
    pub offset: usize,
    /// Its size once decompressed.
    pub size: usize,
    /// Compression method (0 stored, 8 deflated).
    pub method: u16,
    /// The scan, when its content is a pickle.
    pub pickle: Option<Report>,
    /// Why it could not be read, if it could not.
    pub error: Option<String>,
}

/// A file's scan: a lone pickle, or every member of an archive.
#[derive(Debug, Clone, PartialEq)]
pub enum FileReport {
    Pickle(Report),
    Zip {
        members: Vec<Member>,
        verdict: Verdict,
    },
}

impl FileReport {
    pub fn verdict(&self) -> &Verdict {
        match self {
            FileReport::Pickle(r) => &r.verdict,
            FileReport::Zip { verdict, .. } => verdict,
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        match self {
            FileReport::Pickle(r) => {
                let mut v = r.to_json();
                v["kind"] = "pickle".into();
                v
            }
            FileReport::Zip { members, verdict } => {
                let members: Vec<serde_json::Value> = members
                    .iter()
                    .map(|m| {
                        let mut v = serde_json::json!({
                            "name": m.name, "offset": m.offset, "size": m.size,
                            "pickle": m.pickle.as_ref().map(Report::to_json),
                        });
                        if let Some(e) = &m.error {
                            v["error"] = e.clone().into();
                        }
                        v
                    })
                    .collect();
                let mut v = serde_json::json!({"kind": "zip", "verdict": verdict.name(), "members": members});
                match verdict {
                    Verdict::Safe => {}
                    Verdict::Unsafe { reasons } => v["reasons"] = serde_json::json!(reasons),
                    Verdict::Malformed { offset, reason } => {
                        v["offset"] = (*offset).into();
                        v["reason"] = reason.clone().into();
                    }
                }
                v
            }
        }
    }
}

const LOCAL: &[u8] = b"PK\x03\x04";
const CENTRAL: &[u8] = b"PK\x01\x02";

fn u16_at(d: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(d.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(d: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(d.get(at..at + 4)?.try_into().ok()?))
}

/// What the central directory says of each member, by the offset of its local header —
/// shifted as zipfile shifts it when the archive sits after other bytes (its end record
/// tells where the directory really is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Central {
    method: u16,
    csize: usize,
}

fn central_directory(data: &[u8]) -> HashMap<usize, Central> {
    let shift = end_record(data)
        .and_then(|eocd| {
            let size = u32_at(data, eocd + 12)? as usize;
            let offset = u32_at(data, eocd + 16)? as usize;
            eocd.checked_sub(size)?.checked_sub(offset)
        })
        .unwrap_or(0);
    let mut out = HashMap::new();
    let mut from = 0;
    while let Some(i) = find(&data[from..], CENTRAL) {
        let at = from + i;
        if let (Some(method), Some(csize), Some(offset)) = (
            u16_at(data, at + 10),
            u32_at(data, at + 20),
            u32_at(data, at + 42),
        ) {
            out.entry(offset as usize + shift).or_insert(Central {
                method,
                csize: csize as usize,
            });
        }
        from = at + 4;
    }
    out
}

/// The end-of-central-directory record, searched from the end as zipfile does.
fn end_record(data: &[u8]) -> Option<usize> {
    let from = data.len().saturating_sub(22 + 65_535);
    data[from..]
        .windows(4)
        .rposition(|w| w == b"PK\x05\x06")
        .map(|i| from + i)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// ZIP64: the real compressed size in the extra field (id 1), after the uncompressed size
/// when that one is in it too.
fn zip64_compressed_size(extra: &[u8], has_uncompressed: bool) -> Option<u64> {
    let mut i = 0;
    while i + 4 <= extra.len() {
        let id = u16_at(extra, i)?;
        let len = u16_at(extra, i + 2)? as usize;
        if id == 1 {
            let at = i + 4 + if has_uncompressed { 8 } else { 0 };
            return Some(u64::from_le_bytes(extra.get(at..at + 8)?.try_into().ok()?));
        }
        i += 4 + len;
    }
    None
}

/// Reads the member whose local header is at `at`; `next` is where the next header starts
/// (the end of a member whose size is nowhere).
fn read_member(
    data: &[u8],
    at: usize,
    next: usize,
    central: &HashMap<usize, Central>,
    opts: &Options,
) -> Member {
    let mut m = Member {
        name: String::new(),
        offset: at,
        size: 0,
        method: 0,
        pickle: None,
        error: None,
    };
    let header = (|| {
        let flags = u16_at(data, at + 6)?;
        let method = u16_at(data, at + 8)?;
        let csize = u32_at(data, at + 18)? as usize;
        let nlen = u16_at(data, at + 26)? as usize;
        let xlen = u16_at(data, at + 28)? as usize;
        let usize_ = u32_at(data, at + 22)?;
        let name = data.get(at + 30..at + 30 + nlen)?;
        let extra = data.get(at + 30 + nlen..at + 30 + nlen + xlen)?;
        let csize = if csize == 0xFFFF_FFFF {
            zip64_compressed_size(extra, usize_ == 0xFFFF_FFFF)? as usize
        } else {
            csize
        };
        Some((flags, method, csize, name, at + 30 + nlen + xlen))
    })();
    let Some((flags, method, csize, name, start)) = header else {
        m.error = Some("truncated local header".into());
        return m;
    };
    m.name = String::from_utf8_lossy(name).into_owned();
    m.method = method;
    if flags & 1 != 0 {
        m.error = Some("encrypted: its content cannot be checked".into());
        return m;
    }
    let listed = central.get(&at).copied();
    let deferred = flags & 8 != 0 && csize == 0;
    if let Some(c) = listed {
        // Loaders read what the directory says; a local header that says otherwise is
        // a disguise (a pickle hidden as "0 bytes" or as "stored").
        if c.method != method || (!deferred && c.csize != csize && c.csize != 0xFFFF_FFFF) {
            m.error = Some(
                "its local header and the central directory disagree on its size or method".into(),
            );
            return m;
        }
    }
    let csize = if deferred {
        match listed {
            Some(c) => c.csize,
            // No size anywhere: up to the next header.
            None => next.saturating_sub(start),
        }
    } else {
        csize
    };
    let Some(raw) = data.get(start..start.saturating_add(csize)) else {
        m.error = Some(format!("{csize} bytes declared, the file ends first"));
        return m;
    };
    let content = match method {
        0 => raw.to_vec(),
        8 => match miniz_oxide::inflate::decompress_to_vec_with_limit(raw, opts.max_bytes) {
            Ok(v) => v,
            Err(e) => {
                m.error = Some(format!("cannot be inflated: {:?}", e.status));
                return m;
            }
        },
        other => {
            m.error = Some(format!("compression method {other} is not supported"));
            return m;
        }
    };
    m.size = content.len();
    // Every member is read as a pickle, whatever its name or its first bytes: only one whose
    // very first opcode is no opcode (or fails at once) is data, because CPython loading it
    // would stop there too.
    let report = crate::scan(&content, opts);
    let data_only = matches!(report.verdict, Verdict::Malformed { offset: 0, .. });
    if !data_only {
        m.pickle = Some(report);
    }
    m
}

/// Scans a file: a pickle, or every member of a ZIP archive.
pub fn scan_file(data: &[u8], opts: &Options) -> FileReport {
    if !data.starts_with(LOCAL) {
        let report = crate::scan(data, opts);
        // A pickle can carry a whole archive that zipfile finds from the end of the file:
        // such a file is both, and is judged as both.
        if end_record(data).is_some() {
            let zip = scan_zip(data, opts);
            if *zip.verdict() != Verdict::Safe {
                return zip;
            }
        }
        return FileReport::Pickle(report);
    }
    scan_zip(data, opts)
}

fn scan_zip(data: &[u8], opts: &Options) -> FileReport {
    let central = central_directory(data);
    let mut headers = Vec::new();
    let mut from = 0;
    while let Some(i) = find(&data[from..], LOCAL) {
        headers.push(from + i);
        from += i + 4;
    }
    // Members may overlap (a header inside another member's bytes is scanned too); what
    // they add up to is bounded, so that overlap cannot make the work quadratic.
    let (mut stored, mut inflated) = (0usize, 0usize);
    let mut members = Vec::new();
    for (i, &at) in headers.iter().enumerate() {
        let next = headers.get(i + 1).copied().unwrap_or(data.len());
        let mut m = read_member(data, at, next, &central, opts);
        // A signature no directory entry points to may be a member's own bytes (tensor data
        // can hold "PK\x03\x04"): unreadable, it is data; readable, it is scanned.
        if m.error.is_some() && !central.is_empty() && !central.contains_key(&at) {
            m.error = None;
        }
        if m.method == 0 {
            stored = stored.saturating_add(m.size);
        } else {
            inflated = inflated.saturating_add(m.size);
        }
        members.push(m);
        let too_much = if stored > 8 * data.len() {
            Some("its members overlap: reading them all is more than 8 times its size")
        } else if inflated > opts.max_bytes {
            Some("its members inflate to more than the size accepted, together")
        } else {
            None
        };
        if let Some(reason) = too_much {
            return FileReport::Zip {
                members,
                verdict: Verdict::Malformed {
                    offset: at,
                    reason: reason.into(),
                },
            };
        }
    }
    let mut reasons = Vec::new();
    let mut malformed = None;
    for m in &members {
        if let Some(e) = &m.error {
            malformed.get_or_insert((m.offset, format!("{}: {e}", m.name)));
        }
        match m.pickle.as_ref().map(|r| &r.verdict) {
            Some(Verdict::Unsafe { reasons: r }) => {
                reasons.extend(r.iter().map(|why| format!("{}: {why}", m.name)))
            }
            Some(Verdict::Malformed { offset, reason }) => {
                malformed.get_or_insert((m.offset + offset, format!("{}: {reason}", m.name)));
            }
            _ => {}
        }
    }
    let verdict = match (malformed, reasons.is_empty()) {
        (Some((offset, reason)), _) => Verdict::Malformed { offset, reason },
        (None, false) => Verdict::Unsafe { reasons },
        (None, true) => Verdict::Safe,
    };
    FileReport::Zip { members, verdict }
}
