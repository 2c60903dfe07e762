//! Files: a pickle, or a ZIP archive of them (PyTorch's `.pt`/`.pth`/`.ckpt`), or a tar
//! archive of them (PyTorch's legacy format). ZIP members are found by their local headers
//! wherever they are, not only through the central directory, and a pickle is recognised by
//! its content, not its name: a bad CRC, odd flag bits or a duplicate name hide nothing.

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
    Tar {
        members: Vec<Member>,
        verdict: Verdict,
    },
}

impl FileReport {
    pub fn verdict(&self) -> &Verdict {
        match self {
            FileReport::Pickle(r) => &r.verdict,
            FileReport::Zip { verdict, .. } | FileReport::Tar { verdict, .. } => verdict,
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        match self {
            FileReport::Pickle(r) => {
                let mut v = r.to_json();
                v["kind"] = "pickle".into();
                v
            }
            FileReport::Zip { members, verdict } | FileReport::Tar { members, verdict } => {
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
                let kind = if matches!(self, FileReport::Tar { .. }) {
                    "tar"
                } else {
                    "zip"
                };
                let mut v = serde_json::json!({"kind": kind, "verdict": verdict.name(), "members": members});
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

/// What the central directory says of each member, by the offset of its local header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Central {
    method: u16,
    csize: usize,
}

fn u64_at(d: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(d.get(at..at + 8)?.try_into().ok()?))
}

/// The central directory, read as each reader reads it: zipfile from where the end record's
/// position says it is (shifting every offset when the archive sits after other bytes,
/// ZIP64 end record included), and miniz (torch) at the offset the end record gives, with no
/// shift. A member either finds is a member; two readings that disagree are a disguise.
fn central_directory(data: &[u8]) -> Result<HashMap<usize, Central>, String> {
    let mut out = HashMap::new();
    let Some(eocd) = end_record(data) else {
        return Ok(out);
    };
    let (mut size, mut offset) = (
        u32_at(data, eocd + 12).unwrap_or(0) as u64,
        u32_at(data, eocd + 16).unwrap_or(0) as u64,
    );
    let mut concat = 0i64;
    if eocd >= 20 && data.get(eocd - 20..eocd - 16) == Some(b"PK\x06\x07") {
        let record = eocd
            .checked_sub(76)
            .filter(|&r| data.get(r..r + 4) == Some(b"PK\x06\x06"));
        let Some(record) = record else {
            return Err("a ZIP64 locator without its end record".into());
        };
        size = u64_at(data, record + 40).unwrap_or(0);
        offset = u64_at(data, record + 48).unwrap_or(0);
        concat -= 76;
    }
    let (Ok(size_i), Ok(offset_i)) = (i64::try_from(size), i64::try_from(offset)) else {
        return Err("the end record's directory is out of range".into());
    };
    concat += eocd as i64 - size_i - offset_i;
    for (start, shift) in [(offset_i + concat, concat), (offset_i, 0)] {
        if shift == 0 && concat == 0 && !out.is_empty() {
            break; // no shift: both read the same entries
        }
        let Ok(mut at) = usize::try_from(start) else {
            continue;
        };
        let end = at.saturating_add(size as usize).min(data.len());
        while at < end && data.get(at..at + 4) == Some(CENTRAL) {
            let entry = (|| {
                let method = u16_at(data, at + 10)?;
                let mut csize = u32_at(data, at + 20)? as u64;
                let mut usize_ = u32_at(data, at + 24)? as u64;
                let (nlen, xlen, clen) = (
                    u16_at(data, at + 28)? as usize,
                    u16_at(data, at + 30)? as usize,
                    u16_at(data, at + 32)? as usize,
                );
                let mut local = u32_at(data, at + 42)? as u64;
                let extra = data.get(at + 46 + nlen..at + 46 + nlen + xlen)?;
                // ZIP64 (extra field 1): the real values of those set to 0xFFFFFFFF, in order.
                if let Some(mut z) = zip64_field(extra) {
                    for v in [&mut usize_, &mut csize, &mut local] {
                        if *v == 0xFFFF_FFFF {
                            *v = u64_at(z, 0)?;
                            z = &z[8..];
                        }
                    }
                }
                Some((method, csize, local, 46 + nlen + xlen + clen))
            })();
            let Some((method, csize, local, len)) = entry else {
                return Err(format!(
                    "a truncated central directory entry at offset {at}"
                ));
            };
            let key = i64::try_from(local).ok().map(|l| l + shift);
            let Some(key) = key.and_then(|k| usize::try_from(k).ok()) else {
                return Err(format!(
                    "a central directory entry at offset {at} points before the file"
                ));
            };
            let c = Central {
                method,
                csize: usize::try_from(csize).unwrap_or(usize::MAX),
            };
            if *out.entry(key).or_insert(c) != c {
                return Err(format!(
                    "the central directory says two things of the member at offset {key}"
                ));
            }
            at += len;
        }
    }
    Ok(out)
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

/// The ZIP64 extra field's data (id 1), if the extra fields hold one.
fn zip64_field(extra: &[u8]) -> Option<&[u8]> {
    let mut i = 0;
    while i + 4 <= extra.len() {
        let id = u16_at(extra, i)?;
        let len = u16_at(extra, i + 2)? as usize;
        if id == 1 {
            return extra.get(i + 4..i + 4 + len);
        }
        i += 4 + len;
    }
    None
}

/// ZIP64: the real compressed size in the extra field, after the uncompressed size when that
/// one is in it too.
fn zip64_compressed_size(extra: &[u8], has_uncompressed: bool) -> Option<u64> {
    let z = zip64_field(extra)?;
    u64_at(z, if has_uncompressed { 8 } else { 0 })
}

/// Reads the member whose local header is at `at`; `next` is where the next header starts
/// (the end of a member whose size is nowhere).
fn read_member(
    data: &[u8],
    at: usize,
    next: usize,
    central: &HashMap<usize, Central>,
    opts: &Options,
    inflate_left: &mut usize,
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
        if c.method != method || (!deferred && c.csize != csize) {
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
        // What every member inflates to counts, failed ones too: many headers pointing at
        // one stream must not inflate it again and again.
        8 => match miniz_oxide::inflate::decompress_to_vec_with_limit(raw, *inflate_left) {
            Ok(v) => {
                *inflate_left -= v.len();
                v
            }
            Err(e) => {
                *inflate_left = inflate_left.saturating_sub(e.output.len());
                m.error = Some(if *inflate_left == 0 {
                    "the members inflate to more than the size accepted, together".into()
                } else {
                    format!("cannot be inflated: {:?}", e.status)
                });
                return m;
            }
        },
        other => {
            m.error = Some(format!("compression method {other} is not supported"));
            return m;
        }
    };
    m.size = content.len();
    scan_member(&mut m, &content, opts);
    m
}

/// Every member is read as a pickle, whatever its name or its first bytes: only one whose
/// very first opcode is no opcode (or fails at once) is data, because CPython loading it
/// would stop there too.
fn scan_member(m: &mut Member, content: &[u8], opts: &Options) {
    m.size = content.len();
    if content.len() > opts.max_bytes {
        m.error = Some(format!("more than the {} bytes accepted", opts.max_bytes));
        return;
    }
    let report = crate::scan(content, opts);
    let data_only =
        matches!(report.verdict, Verdict::Malformed { offset: 0, .. }) && report.opcodes <= 1;
    if !data_only {
        m.pickle = Some(report);
    }
}

/// Names from an archive go into messages a terminal shows: control characters escaped,
/// and no longer than a line.
fn shown(name: &str) -> String {
    crate::shown(name)
}

/// An archive's verdict from its members': the first malformed one, else every reason.
fn fold(members: &[Member]) -> Verdict {
    let mut reasons = Vec::new();
    let mut malformed = None;
    for m in members {
        let name = shown(&m.name);
        if let Some(e) = &m.error {
            malformed.get_or_insert((m.offset, format!("{name}: {e}")));
        }
        match m.pickle.as_ref().map(|r| &r.verdict) {
            Some(Verdict::Unsafe { reasons: r }) => {
                reasons.extend(r.iter().map(|why| format!("{name}: {why}")))
            }
            Some(Verdict::Malformed { offset, reason }) => {
                malformed.get_or_insert((m.offset + offset, format!("{name}: {reason}")));
            }
            _ => {}
        }
    }
    match (malformed, reasons.is_empty()) {
        (Some((offset, reason)), _) => Verdict::Malformed { offset, reason },
        (None, false) => Verdict::Unsafe { reasons },
        (None, true) => Verdict::Safe,
    }
}

/// Scans a file: a pickle, or every member of a ZIP archive.
pub fn scan_file(data: &[u8], opts: &Options) -> FileReport {
    // torch.load tries the legacy tar format first, whatever the file's first bytes: a file
    // that is a tar archive is judged as one, and as what else it is too.
    if data.get(..512).is_some_and(tar_header) {
        let tar = scan_tar(data, opts);
        let other = scan_pickle_or_zip(data, opts);
        // A tar header read as a pickle mostly fails at its first opcode: harmless.
        let harmless = match &other {
            FileReport::Pickle(r) => {
                r.verdict == Verdict::Safe
                    || matches!(r.verdict, Verdict::Malformed { offset: 0, .. }) && r.opcodes <= 1
            }
            other => *other.verdict() == Verdict::Safe,
        };
        return if harmless || *tar.verdict() != Verdict::Safe {
            tar
        } else {
            other
        };
    }
    scan_pickle_or_zip(data, opts)
}

fn scan_pickle_or_zip(data: &[u8], opts: &Options) -> FileReport {
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
    let malformed = |offset, reason: String| FileReport::Zip {
        members: Vec::new(),
        verdict: Verdict::Malformed { offset, reason },
    };
    let central = match central_directory(data) {
        Ok(c) => c,
        Err(reason) => return malformed(end_record(data).unwrap_or(0), reason),
    };
    let mut headers = Vec::new();
    let mut from = 0;
    while let Some(i) = find(&data[from..], LOCAL) {
        headers.push(from + i);
        from += i + 4;
    }
    // A member the directory lists must be one this scan reads.
    let mut listed: Vec<usize> = central.keys().copied().collect();
    listed.sort_unstable();
    if let Some(&lost) = listed.iter().find(|at| headers.binary_search(at).is_err()) {
        return malformed(
            lost,
            format!(
                "the central directory lists a member at offset {lost}, where no local header is"
            ),
        );
    }
    let mut inflate_left = opts.max_bytes;
    // Members may overlap (a header inside another member's bytes is scanned too); what
    // they add up to is bounded, so that overlap cannot make the work quadratic.
    let (mut stored, mut inflated) = (0usize, 0usize);
    let mut members = Vec::new();
    for (i, &at) in headers.iter().enumerate() {
        let next = headers.get(i + 1).copied().unwrap_or(data.len());
        let mut m = read_member(data, at, next, &central, opts, &mut inflate_left);
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
    let verdict = fold(&members);
    FileReport::Zip { members, verdict }
}

/// A tar header block's checksum is right (as tarfile checks it: unsigned or signed sums).
fn tar_header(block: &[u8]) -> bool {
    let Some(stored) = octal(&block[148..156]) else {
        return false;
    };
    let unsigned: u64 = block
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                32
            } else {
                b as u64
            }
        })
        .sum();
    let signed: i64 = block
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                32
            } else {
                b as i8 as i64
            }
        })
        .sum();
    stored == unsigned || stored as i64 == signed
}

/// A tar number: octal digits (NUL or space ended), or base-256 when the high bit is set.
fn octal(field: &[u8]) -> Option<u64> {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        let mut v: u64 = (field[0] & 0x7f) as u64;
        for &b in &field[1..] {
            v = v.checked_mul(256)?.checked_add(b as u64)?;
        }
        return Some(v);
    }
    let text = std::str::from_utf8(field).ok()?;
    let text = text.trim_matches(|c| c == '\0' || c == ' ');
    if text.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(text, 8).ok()
}

/// A tar archive, as tarfile (and torch's legacy loader, which extracts its members and
/// unpickles them) reads it: headers one after another, pax records that change the next
/// member's size or name, GNU long names; every regular member is scanned as a pickle.
fn scan_tar(data: &[u8], opts: &Options) -> FileReport {
    let mut members = Vec::new();
    let mut at = 0;
    let mut global: HashMap<String, String> = HashMap::new();
    let mut local: HashMap<String, String> = HashMap::new();
    let mut long_name: Option<String> = None;
    let mut read = 0usize;
    let fail = |members: Vec<Member>, offset: usize, reason: String| FileReport::Tar {
        members,
        verdict: Verdict::Malformed { offset, reason },
    };
    while let Some(block) = data.get(at..at + 512) {
        if block.iter().all(|&b| b == 0) || !tar_header(block) {
            break; // the end, as tarfile reads it
        }
        let Some(mut size) = octal(&block[124..136]) else {
            return fail(members, at, "a tar header's size is not a number".into());
        };
        if let Some(s) = local.get("size").or_else(|| global.get("size")) {
            match s.parse::<u64>() {
                Ok(s) => size = s,
                Err(_) => return fail(members, at, "a pax size that is not a number".into()),
            }
        }
        let kind = block[156];
        let start = at + 512;
        let Some(body) = usize::try_from(size)
            .ok()
            .and_then(|n| data.get(start..start.checked_add(n)?))
        else {
            return fail(
                members,
                at,
                format!("a member of {size} bytes runs past the end"),
            );
        };
        let next = start + body.len().div_ceil(512) * 512;
        match kind {
            b'x' | b'g' => {
                let Some(records) = pax_records(body) else {
                    return fail(members, at, "pax records that do not parse".into());
                };
                if kind == b'g' {
                    global.extend(records);
                } else {
                    local = records;
                }
                at = next;
                continue;
            }
            b'L' => {
                long_name = Some(String::from_utf8_lossy(body).trim_end_matches('\0').into());
                at = next;
                continue;
            }
            b'S' => return fail(members, at, "a GNU sparse member is not supported".into()),
            _ => {}
        }
        let name = local
            .remove("path")
            .or_else(|| long_name.take())
            .unwrap_or_else(|| {
                let n = &block[..100];
                let n = &n[..n.iter().position(|&b| b == 0).unwrap_or(100)];
                String::from_utf8_lossy(n).into_owned()
            });
        local.clear();
        // Regular files and types tarfile does not know carry data; other types' sizes
        // are not skipped (as tarfile does).
        let regular = matches!(kind, b'0' | 0 | b'7') || !b"123456".contains(&kind);
        if regular {
            let mut m = Member {
                name,
                offset: at,
                size: 0,
                method: 0,
                pickle: None,
                error: None,
            };
            read = read.saturating_add(body.len());
            if read > opts.max_bytes {
                m.error = Some("the members are more than the size accepted, together".into());
            } else {
                scan_member(&mut m, body, opts);
            }
            members.push(m);
            at = next;
        } else {
            at = start;
        }
    }
    if members.is_empty() && at == 0 {
        return fail(members, 0, "not a tar archive".into());
    }
    let verdict = fold(&members);
    FileReport::Tar { members, verdict }
}

/// pax records: "LEN key=value\n", one after another.
fn pax_records(mut body: &[u8]) -> Option<HashMap<String, String>> {
    let mut out = HashMap::new();
    while !body.is_empty() && body[0] != 0 {
        let space = body.iter().position(|&b| b == b' ')?;
        let len: usize = std::str::from_utf8(&body[..space]).ok()?.parse().ok()?;
        let record = body.get(space + 1..len)?;
        let record = record.strip_suffix(b"\n")?;
        let eq = record.iter().position(|&b| b == b'=')?;
        out.insert(
            String::from_utf8_lossy(&record[..eq]).into_owned(),
            String::from_utf8_lossy(&record[eq + 1..]).into_owned(),
        );
        body = &body[len..];
    }
    Some(out)
}
