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
        /// Bytes the scan parsed or copied to read the headers: bounded by
        /// [`tar_work_limit`], so that no header layout makes the scan more than linear.
        work: usize,
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
            FileReport::Zip { members, verdict }
            | FileReport::Tar {
                members, verdict, ..
            } => {
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
    Some(u16::from_le_bytes(
        d.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}

fn u32_at(d: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        d.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

/// What the central directory says of each member, by the offset of its local header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Central {
    method: u16,
    /// The compressed size: what zipfile reads of a stored member.
    csize: usize,
    /// The uncompressed size: what miniz (under torch.load) reads of a stored member, and
    /// what it requires a deflated one to inflate to.
    usize: usize,
}

fn u64_at(d: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        d.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// The central directory, read as each reader may read it: from every end record a reader
/// could take (zipfile takes the last 22 bytes when they are one, else the last signature
/// within 64 KiB and 22 bytes of the end; miniz the last signature with a whole record after
/// it, a little further back), at the position zipfile computes (shifting every offset when
/// the archive sits after other bytes; ZIP64 end record right before its locator) and at the
/// offset the record gives (miniz, unshifted; ZIP64 record where the locator points). A
/// member any reading finds is a member; readings that disagree are a disguise.
fn central_directory(data: &[u8]) -> Result<HashMap<usize, Central>, String> {
    let mut out = HashMap::new();
    let mut seen = std::collections::HashSet::new();
    // Reading a directory costs its bytes: bounded, however many records the end holds.
    let mut left = data.len().saturating_mul(8).saturating_add(1 << 20);
    for eocd in end_records(data) {
        let (size, offset) = (
            u32_at(data, eocd + 12).unwrap_or(0) as u64,
            u32_at(data, eocd + 16).unwrap_or(0) as u64,
        );
        // The 32-bit fields are read too when a ZIP64 locator is there: both readers fall back
        // on them when their ZIP64 record is missing.
        let mut readings = vec![(size, offset, 0i64, true), (size, offset, 0, false)];
        if eocd >= 20 && data.get(eocd - 20..eocd - 16) == Some(b"PK\x06\x07") {
            let pointed = u64_at(data, eocd - 12).and_then(|r| usize::try_from(r).ok());
            for (record, zipfile) in [(eocd.checked_sub(76), true), (pointed, false)] {
                // `r` comes from the file: anywhere up to the end of the address space.
                let at_record = |r: usize| data.get(r..).and_then(|d| d.get(..4));
                if let Some(r) = record.filter(|&r| at_record(r) == Some(b"PK\x06\x06")) {
                    let (size, offset) = (
                        u64_at(data, r + 40).unwrap_or(0),
                        u64_at(data, r + 48).unwrap_or(0),
                    );
                    readings.push((size, offset, if zipfile { -76 } else { 0 }, zipfile));
                }
            }
        }
        for (size, offset, extra, zipfile) in readings {
            let (Ok(size), Ok(offset)) = (i64::try_from(size), i64::try_from(offset)) else {
                return Err("an end record's directory is out of range".into());
            };
            // zipfile's arithmetic has no overflow; values that overflow ours are no place
            // in the file.
            let shift = if zipfile {
                (eocd as i64)
                    .checked_sub(size)
                    .and_then(|x| x.checked_sub(offset))
                    .and_then(|x| x.checked_add(extra))
            } else {
                Some(0)
            };
            let Some((shift, at)) = shift.and_then(|s| Some((s, offset.checked_add(s)?))) else {
                return Err("an end record's directory is out of range".into());
            };
            // The same start read for another size is another reading: a directory listed
            // longer by one record holds members the shorter one hides.
            if !seen.insert((at, shift, size)) {
                continue;
            }
            read_directory(data, at, size, shift, &mut out, &mut left)?;
        }
    }
    Ok(out)
}

/// Every place an end-of-central-directory record may be taken from: each signature in the
/// last 64 KiB + 22 bytes of the file and a little more (miniz searches in 4 KiB steps),
/// with a whole record after it.
fn end_records(data: &[u8]) -> Vec<usize> {
    let from = data.len().saturating_sub(22 + 65_535 + 4096);
    let last = data.len().saturating_sub(22);
    data[from..]
        .windows(4)
        .enumerate()
        .filter(|(i, w)| *w == b"PK\x05\x06" && from + i <= last)
        .map(|(i, _)| from + i)
        .collect()
}

/// One reading of a directory of `size` bytes at `start`, offsets shifted by `shift`.
fn read_directory(
    data: &[u8],
    start: i64,
    size: i64,
    shift: i64,
    out: &mut HashMap<usize, Central>,
    left: &mut usize,
) -> Result<(), String> {
    let Ok(mut at) = usize::try_from(start) else {
        return Ok(());
    };
    let end = at
        .saturating_add(usize::try_from(size).unwrap_or(0))
        .min(data.len());
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
            Some((method, csize, usize_, local, 46 + nlen + xlen + clen))
        })();
        let Some((method, csize, usize_, local, len)) = entry else {
            return Err(format!(
                "a truncated central directory entry at offset {at}"
            ));
        };
        *left = left
            .checked_sub(len)
            .ok_or("more central directories than its size allows")?;
        let key = i64::try_from(local).ok().and_then(|l| l.checked_add(shift));
        let Some(key) = key.and_then(|k| usize::try_from(k).ok()) else {
            return Err(format!(
                "a central directory entry at offset {at} points before the file"
            ));
        };
        let c = Central {
            method,
            csize: usize::try_from(csize).unwrap_or(usize::MAX),
            usize: usize::try_from(usize_).unwrap_or(usize::MAX),
        };
        if *out.entry(key).or_insert(c) != c {
            return Err(format!(
                "the central directory says two things of the member at offset {key}"
            ));
        }
        at += len;
    }
    Ok(())
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

/// A local header's sizes, compressed then uncompressed: ZIP64 puts the real value of each
/// one set to 0xFFFFFFFF in the extra field, the uncompressed size first.
fn local_sizes(extra: &[u8], csize: u32, usize_: u32) -> Option<(u64, u64)> {
    let (mut c, mut u) = (csize as u64, usize_ as u64);
    if c == 0xFFFF_FFFF || u == 0xFFFF_FFFF {
        let mut z = zip64_field(extra)?;
        for v in [&mut u, &mut c] {
            if *v == 0xFFFF_FFFF {
                *v = u64_at(z, 0)?;
                z = &z[8..];
            }
        }
    }
    Some((c, u))
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
    consumed: &mut usize,
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
        let nlen = u16_at(data, at + 26)? as usize;
        let xlen = u16_at(data, at + 28)? as usize;
        let name = data.get(at + 30..at + 30 + nlen)?;
        let extra = data.get(at + 30 + nlen..at + 30 + nlen + xlen)?;
        let (csize, usize_) = local_sizes(extra, u32_at(data, at + 18)?, u32_at(data, at + 22)?)?;
        let size = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        Some((
            flags,
            method,
            size(csize),
            size(usize_),
            name,
            at + 30 + nlen + xlen,
        ))
    })();
    let Some((flags, method, csize, local_usize, name, start)) = header else {
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
    // The size a member has once extracted, where a header says it: what miniz reads of a
    // stored member (zipfile reads the compressed size) and what it requires a deflated one
    // to inflate to (zipfile cuts one that inflates to more).
    let declared = match listed {
        Some(c) => Some(c.usize),
        None => (!deferred).then_some(local_usize),
    };
    if let (0, Some(size)) = (method, declared) {
        if size != csize {
            m.error = Some(format!(
                "stored, with a compressed size of {csize} bytes and a size of {size}: zipfile \
                 reads the one, miniz (torch.load) the other"
            ));
            return m;
        }
    }
    let Some(raw) = data.get(start..start.saturating_add(csize)) else {
        m.error = Some(format!("{csize} bytes declared, the file ends first"));
        return m;
    };
    // What is read of the file, stored or compressed: headers may share their bytes.
    *consumed = consumed.saturating_add(raw.len());
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
    if let Some(size) = declared.filter(|&size| size != content.len()) {
        m.size = content.len();
        m.error = Some(format!(
            "inflates to {} bytes where its header says {size}: miniz (torch.load) refuses it, \
             zipfile cuts it",
            content.len()
        ));
        return m;
    }
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
    if !no_pickle(&report) {
        m.pickle = Some(report);
    }
}

/// Bytes whose very first opcode fails (or that are empty): CPython reading them would stop
/// there too.
fn no_pickle(report: &Report) -> bool {
    matches!(report.verdict, Verdict::Malformed { offset: 0, .. }) && report.opcodes <= 1
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
        let mut tar = scan_tar(data, opts);
        let (other, carried) = scan_pickle_or_zip(data, opts);
        // A tar header read as a pickle mostly fails at its first opcode: harmless.
        let harmless = match &other {
            FileReport::Pickle(r) => r.verdict == Verdict::Safe || no_pickle(r),
            other => *other.verdict() == Verdict::Safe,
        };
        if !harmless && *tar.verdict() == Verdict::Safe {
            return other;
        }
        // The archive zipfile finds from the end was read too: its members are listed
        // with the tar's, each scanned as zipfile and miniz read it.
        if let (true, FileReport::Tar { members, .. }) = (harmless, &mut tar) {
            members.extend(match other {
                FileReport::Zip { members: zip, .. } => zip,
                _ => carried,
            });
        }
        return tar;
    }
    scan_pickle_or_zip(data, opts).0
}

/// The file as a pickle or a ZIP archive, and the members of a safe archive a pickle
/// carries (zipfile finds it from the end of the file).
fn scan_pickle_or_zip(data: &[u8], opts: &Options) -> (FileReport, Vec<Member>) {
    if !data.starts_with(LOCAL) {
        let report = crate::scan(data, opts);
        // A pickle can carry a whole archive that zipfile finds from the end of the file:
        // such a file is both, and is judged as both.
        let mut carried = Vec::new();
        if !end_records(data).is_empty() {
            match scan_zip(data, opts) {
                FileReport::Zip {
                    members,
                    verdict: Verdict::Safe,
                } => carried = members,
                zip => return (zip, Vec::new()),
            }
        }
        return (FileReport::Pickle(report), carried);
    }
    (scan_zip(data, opts), Vec::new())
}

fn scan_zip(data: &[u8], opts: &Options) -> FileReport {
    let malformed = |offset, reason: String| FileReport::Zip {
        members: Vec::new(),
        verdict: Verdict::Malformed { offset, reason },
    };
    let central = match central_directory(data) {
        Ok(c) => c,
        Err(reason) => return malformed(end_records(data).last().copied().unwrap_or(0), reason),
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
    let (mut consumed, mut inflated) = (0usize, 0usize);
    let mut members = Vec::new();
    for (i, &at) in headers.iter().enumerate() {
        let next = headers.get(i + 1).copied().unwrap_or(data.len());
        let mut m = read_member(
            data,
            at,
            next,
            &central,
            opts,
            &mut inflate_left,
            &mut consumed,
        );
        // A signature no directory entry points to may be a member's own bytes (tensor data
        // can hold "PK\x03\x04"): unreadable, it is data; readable, it is scanned.
        if m.error.is_some() && !central.is_empty() && !central.contains_key(&at) {
            m.error = None;
        }
        if m.method != 0 {
            inflated = inflated.saturating_add(m.size);
        }
        members.push(m);
        let too_much = if consumed > 8 * data.len() {
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

/// A tar header block's checksum is right, as tarfile checks it (unsigned or signed sums).
fn tar_header(block: &[u8]) -> bool {
    let Some(stored) = nti(&block[148..156]) else {
        return false;
    };
    let (mut unsigned, mut signed) = (0i128, 0i128);
    for (i, &b) in block.iter().enumerate() {
        let (u, s) = if (148..156).contains(&i) {
            (32, 32)
        } else {
            (b as i128, b as i8 as i128)
        };
        unsigned += u;
        signed += s;
    }
    stored == unsigned || stored == signed
}

/// tarfile's `nti`: base-256 when the first byte is 0x80 (0xff: negative), else the text up
/// to the first NUL, ASCII, read as Python's `int(s.strip() or "0", 8)` reads it.
fn nti(field: &[u8]) -> Option<i128> {
    if let Some((&first, rest)) = field.split_first() {
        if first == 0x80 || first == 0xff {
            let mut n: i128 = 0;
            for &b in rest {
                n = n.checked_mul(256)?.checked_add(b as i128)?;
            }
            if first == 0xff {
                n -= 256i128.checked_pow(rest.len() as u32)?;
            }
            return Some(n);
        }
    }
    let text = field.split(|&b| b == 0).next().unwrap_or_default();
    if !text.is_ascii() {
        return None;
    }
    let text = std::str::from_utf8(text).ok()?;
    let text = text.trim_matches(|c: char| {
        c.is_ascii_whitespace() || ('\x1c'..='\x1f').contains(&c) || c == '\x0b'
    });
    if text.is_empty() {
        return Some(0);
    }
    let (negative, text) = match text.as_bytes()[0] {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let text = text
        .strip_prefix("0o")
        .or_else(|| text.strip_prefix("0O"))
        .map(|t| t.strip_prefix('_').unwrap_or(t))
        .unwrap_or(text);
    // Single underscores between digits only.
    let b = text.as_bytes();
    if b.is_empty() || b[0] == b'_' || b[b.len() - 1] == b'_' || text.contains("__") {
        return None;
    }
    let n = i128::from_str_radix(&text.replace('_', ""), 8).ok()?;
    Some(if negative { -n } else { n })
}

/// A tar archive, as tarfile (and torch's legacy loader, which extracts its members and
/// unpickles them) reads it: header after header until one is empty or invalid; pax
/// records (`x`, `X`, `g`) and GNU long names (`L`, `K`) for the member after them; data only
/// for regular members and types tarfile does not know (an old-style regular member whose
/// name ends in `/` is a directory). A pax size that differs from the header's, where
/// readers would then disagree on where the next header is, is malformed. Every regular
/// member is scanned as a pickle.
/// Header work a tar of `len` bytes may ask for: every header and pax record is parsed once
/// (about its own size); what can be multiplied is a global record applied to every member
/// (its path, its link), which legitimate archives keep short.
pub fn tar_work_limit(len: usize) -> usize {
    len.saturating_mul(4).saturating_add(1 << 20)
}

fn scan_tar(data: &[u8], opts: &Options) -> FileReport {
    let mut members = Vec::new();
    let mut at = 0;
    // tarfile applies the global records to every member; an extended header's records
    // override them for the next member. Looked up in that order, never copied.
    let mut global: HashMap<String, String> = HashMap::new();
    let mut local: Option<HashMap<String, String>> = None;
    let mut long_name: Option<String> = None;
    let mut long_link: Option<String> = None;
    let mut read = 0usize;
    let mut work = 0usize;
    let limit = tar_work_limit(data.len());
    let fail = |members: Vec<Member>, offset: usize, reason: &str, work: usize| FileReport::Tar {
        members,
        verdict: Verdict::Malformed {
            offset,
            reason: reason.into(),
        },
        work,
    };
    while let Some(block) = data.get(at..at + 512) {
        if block.iter().all(|&b| b == 0) || !tar_header(block) {
            break; // where tarfile stops
        }
        // Each block is a header once at most: linear, checked below with what is copied.
        work += 512;
        let Some(size) = nti(&block[124..136]).and_then(|n| usize::try_from(n).ok()) else {
            return fail(members, at, "a tar header's size is not a size", work);
        };
        let start = at + 512;
        let Some(body) = start.checked_add(size).and_then(|end| data.get(start..end)) else {
            return fail(
                members,
                at,
                "a tar member runs past the end of the file",
                work,
            );
        };
        let next = start + size.div_ceil(512) * 512;
        let raw_name = {
            let n = &block[..100];
            String::from_utf8_lossy(&n[..n.iter().position(|&b| b == 0).unwrap_or(100)])
                .into_owned()
        };
        let mut kind = block[156];
        if kind == 0 && raw_name.ends_with('/') {
            kind = b'5';
        }
        match kind {
            b'x' | b'X' | b'g' => {
                if local.is_some() || long_name.is_some() {
                    return fail(
                        members,
                        at,
                        "pax records after other extended headers",
                        work,
                    );
                }
                // tarfile parses the records over the whole blocks, padding included.
                let blocks = &data[start..next.min(data.len())];
                work += blocks.len();
                let Some(records) = pax_records(blocks) else {
                    return fail(members, at, "pax records that do not parse", work);
                };
                if records.keys().any(|k| k.starts_with("GNU.sparse.")) {
                    return fail(members, at, "GNU sparse records are not supported", work);
                }
                if kind == b'g' {
                    global.extend(records);
                } else {
                    local = Some(records);
                }
                at = next;
                continue;
            }
            b'L' | b'K' => {
                if local.is_some() {
                    return fail(members, at, "a GNU long name after pax records", work);
                }
                work += body.len();
                let text = String::from_utf8_lossy(body)
                    .trim_end_matches('\0')
                    .to_string();
                let slot = if kind == b'L' {
                    &mut long_name
                } else {
                    &mut long_link
                };
                // tarfile takes the first of two (the outer header patches last), other
                // readers the last.
                if slot.replace(text).is_some() {
                    return fail(
                        members,
                        at,
                        "two GNU long names for one member: readers take different ones",
                        work,
                    );
                }
                at = next;
                continue;
            }
            b'S' => return fail(members, at, "a GNU sparse member is not supported", work),
            _ => {}
        }
        let local_records = local.take();
        let pax = |key: &str| {
            local_records
                .as_ref()
                .and_then(|l| l.get(key))
                .or_else(|| global.get(key))
        };
        if let Some(s) = pax("size") {
            if s.parse::<usize>().ok() != Some(size) {
                return fail(
                    members,
                    at,
                    "a pax size that differs from the header's: readers would disagree on \
                     where the next member is",
                    work,
                );
            }
        }
        // tarfile lets a GNU long name override pax records, other readers the reverse: a
        // link checked under one name would be followed under the other.
        if (long_name.is_some() && pax("path").is_some())
            || (long_link.is_some() && pax("linkpath").is_some())
        {
            return fail(
                members,
                at,
                "a GNU long name and a pax path for one member: readers take different ones",
                work,
            );
        }
        let name = pax("path")
            .cloned()
            .or_else(|| long_name.take())
            .unwrap_or(raw_name);
        long_name = None;
        let link = pax("linkpath")
            .cloned()
            .or_else(|| long_link.take())
            .unwrap_or_else(|| {
                let n = &block[157..257];
                String::from_utf8_lossy(&n[..n.iter().position(|&b| b == 0).unwrap_or(100)])
                    .into_owned()
            });
        long_link = None;
        // A global path or link is copied into every member that follows.
        work += name.len() + link.len();
        if work > limit {
            return fail(
                members,
                at,
                "its headers ask for more work than its size allows",
                work,
            );
        }
        // torch extracts its members to disk and reads them: a link out of the archive
        // would have it read a file this scan never sees.
        if matches!(kind, b'1' | b'2')
            && (link.starts_with('/') || link.split('/').any(|part| part == ".."))
        {
            return fail(members, at, "a link that points out of the archive", work);
        }
        let regular = !b"123456".contains(&kind);
        if !regular {
            at = start;
            continue;
        }
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
    }
    let verdict = fold(&members);
    FileReport::Tar {
        members,
        verdict,
        work,
    }
}

/// pax records as tarfile parses them: "LEN key=value\n", one after another until a NUL or
/// the end of the blocks, each at least 5 bytes and framed exactly.
fn pax_records(buf: &[u8]) -> Option<HashMap<String, String>> {
    let mut out = HashMap::new();
    let mut pos = 0;
    while pos < buf.len() && buf[pos] != 0 {
        let digits = buf[pos..].iter().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 || digits > 20 || buf.get(pos + digits) != Some(&b' ') {
            return None;
        }
        let len: usize = std::str::from_utf8(&buf[pos..pos + digits])
            .ok()?
            .parse()
            .ok()?;
        let end = pos.checked_add(len)?;
        if len < 5 || end > buf.len() || buf[end - 1] != b'\n' {
            return None;
        }
        let record = &buf[pos + digits + 1..end - 1];
        let eq = record.iter().position(|&b| b == b'=').filter(|&e| e > 0)?;
        out.insert(
            String::from_utf8_lossy(&record[..eq]).into_owned(),
            String::from_utf8_lossy(&record[eq + 1..]).into_owned(),
        );
        pos = end;
    }
    Some(out)
}
