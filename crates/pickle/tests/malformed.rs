//! Bad input: a `malformed` verdict with the offset and a clear reason, never a panic, and no
//! allocation a header merely claims.

use airlock_pickle::{decode, scan, DecodeError, Options, Verdict};

fn malformed(data: &[u8]) -> (usize, String) {
    match scan(data, &Options::default()).verdict {
        Verdict::Malformed { offset, reason } => (offset, reason),
        other => panic!("{data:?}: {other:?}"),
    }
}

#[test]
fn broken_streams_are_malformed_with_their_offset() {
    // A 4 GiB BINUNICODE header in a 20-byte file.
    let (at, why) = malformed(b"\x80\x04X\xff\xff\xff\xffabcdefghijklm.");
    assert_eq!(at, 2);
    assert!(why.contains("4294967295") && why.contains("14"), "{why}");
    // BINUNICODE8 and BINBYTES8 claiming 2**64-1 bytes.
    assert!(malformed(b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\xffx.")
        .1
        .contains("declares"));
    assert!(malformed(b"\x80\x04\x8e\xff\xff\xff\xff\xff\xff\xff\xffx.")
        .1
        .contains("declares"));
    assert_eq!(
        malformed(b"\x80\x04K\x01").1,
        "the pickle ends without STOP"
    );
    assert_eq!(malformed(b""), (0, "the pickle ends without STOP".into()));
    assert!(malformed(b"\x80\x04\xff.")
        .1
        .contains("unknown opcode 0xff"));
    assert_eq!(malformed(b"\x80\x04h\x07.").1, "memo 7 was never stored");
    assert_eq!(
        malformed(b"\x80\x04j\xff\xff\xff\xff.").1,
        "memo 4294967295 was never stored"
    );
    assert_eq!(malformed(b"\x80\x04a.").1, "stack underflow");
    assert_eq!(malformed(b"\x80\x04(.").1, "stack underflow");
    assert_eq!(malformed(b"\x80\x04K\x01t.").1, "no MARK to pop to");
    // What follows STOP is ignored, as CPython ignores it, unless it is another pickle.
    let r = scan(b"\x80\x04N.garbage", &Options::default());
    assert_eq!(
        (r.verdict, r.pickles, r.trailing_bytes),
        (Verdict::Safe, 1, 7)
    );
    let r = scan(b"\x80\x04N.\x80\x02cos\nsystem\n.", &Options::default());
    assert!(matches!(r.verdict, Verdict::Unsafe { .. }), "{r:?}");
    assert_eq!(r.pickles, 2);
    // What ran before the stream broke counts.
    let r = scan(b"\x80\x02cos\nsystem\nVid\n\x85R\xff", &Options::default());
    match r.verdict {
        Verdict::Unsafe { reasons } => assert!(
            reasons.iter().any(|x| x.contains("malformed at offset")),
            "{reasons:?}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(malformed(b"\x80\x09N.").1.contains("protocol 9"));
    assert!(malformed(b"Ixyz\n.").1.contains("INT"));
    assert!(malformed(b"S'unterminated\n.").1.contains("STRING"));
    assert!(malformed(b"\x80\x04K\x01K\x02a.")
        .1
        .contains("an int, which has no extend or append"));
    // A last line without its newline is still read (less its last byte) by both
    // unpicklers: the module is imported before the stream breaks.
    let r = scan(b"cos\nsystemX", &Options::default());
    assert_eq!(r.globals[0].qualified(), "os.system");
    assert!(matches!(r.verdict, Verdict::Unsafe { .. }), "{r:?}");
    // Random garbage never panics, whatever it says.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for _ in 0..20_000 {
        let len = (x % 64) as usize;
        let mut data = Vec::with_capacity(len);
        for _ in 0..len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            data.push(x as u8);
        }
        let _ = scan(&data, &Options::default());
        let _ = decode(&data, &Options::default());
    }
}

#[test]
fn cycles_and_deep_nesting_are_not_representable_but_never_crash() {
    // A list that contains itself, through the memo.
    let cyclic = b"\x80\x02]q\x00h\x00a.";
    assert_eq!(scan(cyclic, &Options::default()).verdict, Verdict::Safe);
    assert!(matches!(
        decode(cyclic, &Options::default()),
        Err(DecodeError::Unrepresentable(_))
    ));
    // 200 000 nested lists: parsing is a loop, decoding stops at max_depth.
    let mut deep = b"\x80\x02".to_vec();
    deep.extend(std::iter::repeat_n(b']', 200_000));
    deep.extend(std::iter::repeat_n(b'a', 199_999));
    deep.push(b'.');
    assert_eq!(scan(&deep, &Options::default()).verdict, Verdict::Safe);
    assert!(matches!(
        decode(&deep, &Options::default()),
        Err(DecodeError::Unrepresentable(_))
    ));
    // Shared, not cyclic: fine.
    let shared = b"\x80\x02(]q\x00h\x00l.";
    assert_eq!(
        decode(shared, &Options::default()).unwrap(),
        serde_json::json!([[], []])
    );
}

#[test]
fn a_name_is_allowed_only_exactly() {
    let mut opts = Options::default();
    opts.allow.insert("datetime.date".into());
    let date = b"\x80\x02cdatetime\ndate\nM\xe8\x07K\x01K\x02\x87R.";
    assert_eq!(scan(date, &opts).verdict, Verdict::Safe);
    assert_eq!(
        decode(date, &opts).unwrap(),
        serde_json::json!({"$call": "datetime.date", "args": [2024, 1, 2]})
    );
    // An allowed global that is the value itself, not called.
    assert_eq!(
        decode(b"cbuiltins\nset\n.", &opts).unwrap(),
        serde_json::json!({"$global": "builtins.set"})
    );
    // Neither a prefix nor a longer name of an allowed one is allowed.
    for stream in [
        b"\x80\x02cdatetime\ndate.fromtimestamp\nK\x01\x85R.".as_slice(),
        b"\x80\x02cdatetime\ndat\nK\x01\x85R.".as_slice(),
        b"\x80\x02cdatetime.x\ndate\nK\x01\x85R.".as_slice(),
    ] {
        assert!(
            matches!(scan(stream, &opts).verdict, Verdict::Unsafe { .. }),
            "{stream:?}"
        );
    }
    // Reported: every global with its offset, every call site.
    let r = scan(b"\x80\x02cos\nsystem\nVid\n\x85R.", &Options::default());
    assert_eq!(
        (r.protocol, r.globals.len(), r.calls.len()),
        (Some(2), 1, 1)
    );
    assert_eq!(
        (
            r.globals[0].qualified(),
            r.globals[0].offset,
            r.globals[0].allowed
        ),
        ("os.system".into(), 2, false)
    );
    assert_eq!(
        (r.calls[0].opcode, r.calls[0].target.as_deref()),
        ("REDUCE", Some("os.system"))
    );
}

#[test]
fn small_pickles_cannot_ask_for_huge_work_or_output() {
    // A list of 60 000 items, memoized, then `set()` of it 2 000 times: 120 million copies.
    let mut p = b"\x80\x02]q\x00(".to_vec();
    for _ in 0..60_000 {
        p.extend_from_slice(b"K\x01");
    }
    p.push(b'e');
    for _ in 0..2_000 {
        p.extend_from_slice(b"c__builtin__\nset\nh\x00\x85R0");
    }
    p.push(b'.');
    let why = match scan(&p, &Options::default()).verdict {
        Verdict::Malformed { reason, .. } => reason,
        other => panic!("{other:?}"),
    };
    assert!(why.contains("copying"), "{why}");
    // A list holding itself twice, 40 levels deep: 2**40 items once printed.
    let mut p = b"\x80\x02]q\x00".to_vec();
    for _ in 0..40 {
        p.extend_from_slice(b"(h\x00h\x00lq\x00");
    }
    p.push(b'.');
    assert_eq!(scan(&p, &Options::default()).verdict, Verdict::Safe);
    match decode(&p, &Options::default()) {
        Err(DecodeError::Unrepresentable(why)) => assert!(why.contains("shared"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn overlapping_archive_members_cannot_make_the_work_quadratic() {
    // 3 000 local headers, each claiming every byte after it as its own stored member.
    let n = 3_000usize;
    let header = 30 + 1;
    let total = n * header;
    let mut z = Vec::with_capacity(total);
    for i in 0..n {
        let rest = (total - (i + 1) * header) as u32;
        z.extend_from_slice(b"PK\x03\x04\x14\x00\x00\x00\x00\x00\x00\x00\x00\x00");
        z.extend_from_slice(&[0; 4]); // crc
        z.extend_from_slice(&rest.to_le_bytes());
        z.extend_from_slice(&rest.to_le_bytes());
        z.extend_from_slice(&1u16.to_le_bytes());
        z.extend_from_slice(&0u16.to_le_bytes());
        z.push(b'x');
    }
    match airlock_pickle::scan_file(&z, &Options::default()).verdict() {
        Verdict::Malformed { reason, .. } => assert!(reason.contains("overlap"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_archive_pointing_past_the_address_space_is_never_a_panic() {
    // Found by the zip_readers fuzzer: a ZIP64 end locator whose record offset is 2**64 - 2.
    let hex: String = [
        "504b030414000000000000000000d5eaee580a0000000a0000001000000061000000000047400000",
        "000000706b6c58280000006161616161616161616161616161616161616161616161616161616161",
        "616161616161616161616130636f730a735c797374656d0a2853276964270a74522e504b01021400",
        "140000000000000600d164001c004300000043000000100000000000000000000000000000000000",
        "617263686976652f646174612e706b6c504b06062c000000000000002d002d000000000000000000",
        "01000000000000000100000000000000ffffffffffffff7f00000000000000e1504b060700000000",
        "feffffffffffffff01000000504b05060000000001000100ffffffffffffffff0000",
    ]
    .concat();
    let data: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    assert_eq!(&data[data.len() - 22..data.len() - 18], b"PK\x05\x06");
    let report = airlock_pickle::scan_file(&data, &Options::default());
    assert_ne!(report.verdict(), &Verdict::Safe, "{report:?}");
}

#[test]
fn discarded_deep_values_never_overflow_the_stack() {
    // A million nested tuples, thrown away by POP, then more: freed without recursion,
    // on a thread with a small stack.
    let mut p = b"\x80\x04)".to_vec();
    p.extend(std::iter::repeat_n(0x85u8, 1_000_000));
    p.extend_from_slice(b"0N.");
    let verdict = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || scan(&p, &Options::default()).verdict)
        .unwrap()
        .join()
        .expect("no stack overflow");
    assert_eq!(verdict, Verdict::Safe);
}

#[test]
fn cpython_quirks_are_followed() {
    // POP takes a MARK on top (protocol 0 writes this for recursive tuples).
    let recursive = b"((lp0\n(g0\ntp1\na00g1\n.";
    assert_eq!(scan(recursive, &Options::default()).verdict, Verdict::Safe);
    // Integers of more than 4300 digits: CPython refuses them, so do we (quickly).
    let mut big = b"I".to_vec();
    big.extend(std::iter::repeat_n(b'7', 2_000_000));
    big.extend_from_slice(b"\n.");
    assert!(matches!(
        scan(&big, &Options::default()).verdict,
        Verdict::Malformed { .. }
    ));
    // Shared strings are counted by their bytes when decoded.
    let mut amp = b"\x80\x04".to_vec();
    amp.push(b'X');
    amp.extend_from_slice(&100_000u32.to_le_bytes());
    amp.extend(std::iter::repeat_n(b'a', 100_000));
    amp.extend_from_slice(b"\x94(");
    amp.extend(std::iter::repeat_n(*b"h\x00", 1_000).flatten());
    amp.extend_from_slice(b"l\x94(");
    amp.extend(std::iter::repeat_n(*b"h\x01", 1_000).flatten());
    amp.extend_from_slice(b"l.");
    assert_eq!(scan(&amp, &Options::default()).verdict, Verdict::Safe);
    assert!(matches!(
        decode(&amp, &Options::default()),
        Err(DecodeError::Unrepresentable(_))
    ));
}

/// Each of these once disagreed with CPython's unpickler (the hand-made streams of
/// tests/streams.py check them in bulk; these name them).
#[test]
fn values_load_as_cpython_loads_them() {
    let opts = Options::default();
    let text = |p: &[u8]| serde_json::to_string(&decode(p, &opts).unwrap()).unwrap();
    // Dicts keep their order.
    assert_eq!(text(b"}(Vb\nK\x01Va\nK\x02u."), r#"{"b":1,"a":2}"#);
    // Keys Python deems equal are one key: the first's place, the last value.
    assert_eq!(
        text(b"}(K\x01Vx\nF1.0\nVy\n\x88Vz\nK\x02Vw\nu."),
        r#"{"$dict":[[1,"z"],[2,"w"]]}"#
    );
    assert_eq!(text(b"}(Va\nK\x01Vb\nK\x02Va\nK\x03u."), r#"{"a":3,"b":2}"#);
    assert_eq!(text(b"\x8f(K\x01\x88F1.0\nK\x02\x90."), r#"{"$set":[1,2]}"#);
    // Lone surrogates, from UNICODE's escapes and BINUNICODE's surrogatepass.
    assert_eq!(text(b"V\\ud800x\n."), r#"{"$str":[55296,120]}"#);
    assert_eq!(
        text(b"X\x03\x00\x00\x00\xed\xb2\x80."),
        r#"{"$str":[56448]}"#
    );
    // A backslash escapes the next byte only: `\\u0041` is not an escape.
    assert_eq!(text(b"V\\\\u0041\n."), r#""\\\\u0041""#);
    // INT reads C's way (octal, hex, a NUL ends the number; two characters of 0/1 are bools).
    assert_eq!(text(b"I010\n."), "8");
    assert_eq!(text(b"I0x10\n."), "16");
    assert_eq!(text(b"I5\x00x\n."), "5");
    assert_eq!(text(b"I+1\n."), "true");
    assert_eq!(text(b"L 1_000L\n."), "1000");
    assert_eq!(text(b"(K\x01K\x02lK\x00K\x09s."), "[9,2]");
    assert_eq!(text(b"(lp 1\ng1\n."), "[]");
    // FLOAT as pickle.py reads what the C unpickler refuses (whitespace, underscores, no
    // overflow): a reader loads it, so the scan reads on.
    assert_eq!(text(b"F 1.5\n."), "1.5");
    assert_eq!(text(b"F1_0\n."), "10.0");
    assert_eq!(text(b"F1e500\n."), r#"{"$airlock":"float","value":"inf"}"#);
    assert!(malformed(b"F1__0\n.").1.contains("FLOAT"));
    assert_eq!(
        text(b"\x80\x05\x96\x01\x00\x00\x00\x00\x00\x00\x00a(K\x62K\x63e."),
        r#"{"$bytearray":"YWJj"}"#
    );
    // What CPython refuses to load.
    for (p, why) in [
        (&b"}(]K\x01u."[..], "unhashable"),
        (b"((K\x01(K\x02ltK\x00d.", "unhashable"),
        (b"L010\n.", "LONG"),
        (b"I1__0\n.", "INT"),
        (b"(K\x01lVx\nK\x01s.", "bad index"),
        (b")K\x00K\x01s.", "a tuple, which has no __setitem__"),
        (b"V\\ud80\n.", "UNICODE"),
    ] {
        let (_, reason) = malformed(p);
        assert!(reason.contains(why), "{p:?}: {reason}");
    }
    // Python 2 names are checked as CPython loads them: below protocol 3 only.
    let r = scan(b"\x80\x02c__builtin__\nset\n)R.", &opts);
    assert_eq!(r.verdict, Verdict::Safe);
    assert_eq!(r.globals[0].qualified(), "builtins.set");
    assert_eq!(r.globals[0].written.as_deref(), Some("__builtin__.set"));
    let r = scan(b"\x80\x03c__builtin__\nset\n)R.", &opts);
    assert!(matches!(r.verdict, Verdict::Unsafe { .. }), "{r:?}");
    let r = scan(b"\x80\x02c__builtin__\nunicode\n(Vx\ntR.", &opts);
    assert_eq!(r.globals[0].qualified(), "builtins.str");
    assert!(matches!(r.verdict, Verdict::Unsafe { .. }), "{r:?}");
}

/// What another reader would read otherwise than `pickle.loads` is never safe: frames that
/// opcodes cross (a file reader goes on after the frame), a frame past STOP (the next
/// load() starts after it), what load() called again reads (the memo kept), and strings
/// whose value depends on the encoding the caller passes.
#[test]
fn what_other_readers_would_read_is_never_safe() {
    let opts = Options::default();
    let payload = b"cos\nsystem\n(S'id'\ntR.";
    let not_safe = |data: &[u8]| {
        let r = scan(data, &opts);
        assert_ne!(r.verdict, Verdict::Safe, "{data:?}");
        assert!(decode(data, &opts).is_err());
        r.verdict
    };
    // A 2-byte frame, then BINBYTES whose length runs past it: pickle.loads reads bytes,
    // pickle.load(file) reads on after the frame, into the payload.
    let mut crossing = b"\x80\x04\x95\x02\x00\x00\x00\x00\x00\x00\x00J\x00\x00\x00\x00C(".to_vec();
    crossing.extend_from_slice(payload);
    crossing.extend_from_slice(b"\x00.");
    match not_safe(&crossing) {
        Verdict::Malformed { reason, .. } => assert!(reason.contains("FRAME"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // A frame longer than what is left (here 2**62 bytes): the C unpickler refuses it,
    // pickle.py reading bytes takes what there is, one reading a file asks for all of it.
    for len in [3u64, 1 << 62, u64::MAX] {
        let mut long = b"\x80\x04\x95".to_vec();
        long.extend_from_slice(&len.to_le_bytes());
        long.extend_from_slice(b"N.");
        match not_safe(&long) {
            Verdict::Malformed { offset: 2, reason } => {
                assert!(reason.contains("FRAME"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }
    let mut past_stop = b"\x80\x04\x95\x03\x00\x00\x00\x00\x00\x00\x00N.\x00".to_vec();
    past_stop.extend_from_slice(payload);
    not_safe(&past_stop);
    // A frame split between an opcode and its argument is read alike by all: fine.
    let split = b"\x80\x04\x95\x01\x00\x00\x00\x00\x00\x00\x00K\x07.";
    assert_eq!(decode(split, &opts).unwrap(), serde_json::json!(7));
    // load() called again on one Unpickler keeps the memo.
    let mut memo = b"(lp0\n.g0\n0".to_vec();
    memo.extend_from_slice(payload);
    assert!(matches!(not_safe(&memo), Verdict::Unsafe { .. }));
    // A STRING that is not ASCII loads with encoding="utf-8" (torch.load) or "latin1".
    let mut encoded = b"N.S'\xc3\xa9'\n0".to_vec();
    encoded.extend_from_slice(payload);
    assert!(matches!(not_safe(&encoded), Verdict::Unsafe { .. }));
    match not_safe(b"S'\xc3\xa9'\n.") {
        Verdict::Malformed { offset: 0, reason } => {
            assert!(reason.contains("encoding"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    // A later pickle that breaks after its first opcode (here on the copying budget) hides
    // what load() called again would reach.
    let mut budget = b"N.\x80\x02]q\x00(".to_vec();
    budget.extend(std::iter::repeat_n(*b"K\x01", 70_000).flatten());
    budget.extend_from_slice(b"ec__builtin__\nset\nq\x01");
    budget.extend(std::iter::repeat_n(*b"h\x01h\x00\x85R0", 200).flatten());
    budget.extend_from_slice(payload);
    match not_safe(&budget) {
        Verdict::Malformed { reason, .. } => assert!(reason.contains("follows"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // A first pickle that spends the work budget to its last units: the scan stopping on its
    // own limit at the next pickle's first opcode says nothing of the stream.
    let mut spent = b"\x80\x02(".to_vec();
    spent.extend(std::iter::repeat_n(b'N', 1000));
    spent.extend_from_slice(b"tq\x000}");
    let (reps, pads) = ((64 * 65536 - 3) / 1001, (64 * 65536 - 3) % 1001);
    spent.extend(std::iter::repeat_n(*b"h\x00Ns", reps).flatten());
    spent.extend(std::iter::repeat_n(*b"NNs", pads).flatten());
    spent.push(b'.');
    spent.extend_from_slice(payload);
    not_safe(&spent);
    // A FLOAT pickle.py reads (the C unpickler does not) opening the next pickle.
    let mut float = b"N.F1_0\n0".to_vec();
    float.extend_from_slice(payload);
    assert!(matches!(not_safe(&float), Verdict::Unsafe { .. }));
    // Bytes whose first opcode is no opcode are no pickle: left alone, as CPython leaves them.
    let r = scan(b"N.\x00\xff junk", &opts);
    assert_eq!((r.verdict, r.trailing_bytes), (Verdict::Safe, 7));
}

/// Small inputs that once asked for exponential or quadratic work, or copies far larger than
/// themselves, are refused on the work budget.
#[test]
fn shared_values_cannot_multiply_the_work() {
    let opts = Options::default();
    let binbytes = |b: &[u8]| [b"B".as_slice(), &(b.len() as u32).to_le_bytes(), b].concat();
    let binuni = |b: &[u8]| [b"X".as_slice(), &(b.len() as u32).to_le_bytes(), b].concat();
    let over_budget = |data: &[u8]| match scan(data, &opts).verdict {
        Verdict::Malformed { reason, .. } => assert!(reason.contains("than its size allows")),
        other => panic!("{other:?}"),
    };
    // A tuple of two references to the one below, 60 levels: 2**60 items as a dict key.
    let mut tower = b"\x80\x04)\x94".to_vec();
    for k in 1u8..60 {
        tower.extend_from_slice(&[b'h', k - 1, b'h', k - 1, 0x86, 0x94]);
    }
    tower.extend_from_slice(b"0}h\x3bNs.");
    over_budget(&tower);
    // bytearray() and _codecs.encode() of one memoized megabyte, 2 000 times.
    let mb = vec![b'A'; 1 << 20];
    let calls = |head: &[u8], arg: &[u8]| {
        let mut d = head.to_vec();
        d.extend_from_slice(b"q\x010");
        d.extend_from_slice(arg);
        d.extend_from_slice(b"q\x020(");
        d.extend(std::iter::repeat_n(*b"h\x01h\x02R", 2_000).flatten());
        d.extend_from_slice(b"e.");
        d
    };
    let mut arg = binbytes(&mb);
    arg.push(0x85);
    over_budget(&calls(b"\x80\x02]q\x00c__builtin__\nbytearray\n", &arg));
    let mut arg = binuni(&mb);
    arg.extend_from_slice(b"X\x06\x00\x00\x00latin1\x86");
    over_budget(&calls(b"\x80\x02]q\x00c_codecs\nencode\n", &arg));
    // STACK_GLOBAL of two memoized megabyte strings, 2 000 times.
    let mut names = b"\x80\x04".to_vec();
    names.extend(binuni(&mb));
    names.extend_from_slice(b"q\x00");
    names.extend(binuni(&mb));
    names.extend_from_slice(b"q\x0100");
    names.extend(std::iter::repeat_n(*b"h\x00h\x01\x930", 2_000).flatten());
    names.extend_from_slice(b"N.");
    match scan(&names, &opts).verdict {
        Verdict::Unsafe { reasons } => {
            assert!(
                reasons.iter().any(|r| r.contains("than its size allows")),
                "{reasons:?}"
            );
            assert!(
                reasons.iter().all(|r| r.len() < 1_000),
                "names are cut in messages"
            );
        }
        other => panic!("{other:?}"),
    }
    // A call site on a memoized global with a megabyte name, 20 000 times: the name is
    // shared, not copied, and the report lists the first call sites and counts the rest.
    let mut calls = b"\x80\x04\x8c\x01a\x94".to_vec();
    calls.push(0x8d);
    calls.extend_from_slice(&(mb.len() as u64).to_le_bytes());
    calls.extend_from_slice(&mb);
    calls.extend_from_slice(b"\x94\x93\x94");
    calls.extend(std::iter::repeat_n(*b"h\x02)R0", 20_000).flatten());
    calls.extend_from_slice(b"N.");
    let r = scan(&calls, &opts);
    assert!(
        matches!(r.verdict, Verdict::Unsafe { .. }),
        "{:?}",
        r.verdict
    );
    assert_eq!((r.calls.len(), r.calls_omitted), (10_000, 10_000));
    assert!(
        r.to_json().to_string().len() < 30 << 20,
        "names are cut in the report"
    );
    // decode: one memoized megabyte str as the key of a dict, 30 000 times.
    let mut keys = b"\x80\x02}q\x00".to_vec();
    keys.extend(binuni(&mb));
    keys.extend_from_slice(b"q\x010(");
    keys.extend(std::iter::repeat_n(*b"h\x01N", 30_000).flatten());
    keys.extend_from_slice(b"u.");
    assert_eq!(scan(&keys, &opts).verdict, Verdict::Safe);
    assert!(matches!(
        decode(&keys, &opts),
        Err(DecodeError::Unrepresentable(_))
    ));
}
