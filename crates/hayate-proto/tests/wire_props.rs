//! Property tests for the wire format (frames, varints, loss maps, packet headers) and for
//! sealed-packet crypto and the replay window.

use std::collections::BTreeSet;

use hayate_proto::crypto::{CryptoError, PacketKey, ReplayWindow, REPLAY_WINDOW};
use hayate_proto::wire::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Owned {
    Padding,
    Ping,
    Ack(AckFrame),
    Ctrl(u64, Vec<u8>),
    PathChallenge([u8; 8]),
    PathResponse([u8; 8]),
    Data(u32, u64, Vec<u8>),
    LossMap(LossMapFrame),
    Close(u64, String),
    Stream(u64, bool, Vec<u8>),
    StreamAck(StreamAckFrame),
}

impl Owned {
    fn frame(&self) -> Frame<'_> {
        match self {
            Owned::Padding => Frame::Padding,
            Owned::Ping => Frame::Ping,
            Owned::Ack(a) => Frame::Ack(a.clone()),
            Owned::Ctrl(offset, data) => Frame::Ctrl {
                offset: *offset,
                data,
            },
            Owned::Data(xfer, block, payload) => Frame::Data {
                xfer: *xfer,
                block: *block,
                payload,
            },
            Owned::LossMap(m) => Frame::LossMap(m.clone()),
            Owned::Close(code, reason) => Frame::Close {
                code: *code,
                reason,
            },
            Owned::PathChallenge(t) => Frame::PathChallenge(*t),
            Owned::PathResponse(t) => Frame::PathResponse(*t),
            Owned::Stream(offset, fin, data) => Frame::Stream {
                offset: *offset,
                fin: *fin,
                data,
            },
            Owned::StreamAck(a) => Frame::StreamAck(a.clone()),
        }
    }
}

fn varint() -> impl Strategy<Value = u64> {
    prop_oneof![
        0..64u64,
        0..16384u64,
        0..(1u64 << 30),
        0..=MAX_VARINT,
        Just(MAX_VARINT),
    ]
}

fn ack() -> impl Strategy<Value = AckFrame> {
    prop::array::uniform9(varint()).prop_map(|f| AckFrame {
        largest_pn: f[0],
        ack_delay_us: f[1],
        ctrl_offset: f[2],
        rx_bytes: f[3],
        rx_time_us: f[4],
        rx_buffered: f[5],
        rx_buffer: f[6],
        rx_drops: f[7],
        store_room: f[8],
    })
}

fn small_or_big() -> impl Strategy<Value = u64> {
    prop_oneof![4 => 0..100u64, 1 => 0..(1u64 << 20), 1 => 0..(1u64 << 40)]
}

/// A valid loss map: gaps built from (delta, len) steps so they are sorted and disjoint.
fn lossmap() -> impl Strategy<Value = LossMapFrame> {
    (
        any::<u32>(),
        small_or_big(),
        small_or_big(),
        prop::collection::vec((small_or_big(), 1..50u64), 0..40),
        small_or_big(),
        small_or_big(),
    )
        .prop_map(|(xfer, cum, lead, steps, tail, above)| {
            let start = cum + lead;
            let mut pos = start;
            let gaps = steps
                .into_iter()
                .map(|(d, l)| {
                    let g = pos + d..pos + d + l;
                    pos = g.end;
                    g
                })
                .collect();
            LossMapFrame {
                xfer,
                cum,
                top: pos + tail + above,
                start,
                end: pos + tail,
                gaps,
            }
        })
}

/// Frames that may appear anywhere in a packet.
fn inner_frame() -> impl Strategy<Value = Owned> {
    prop_oneof![
        Just(Owned::Ping),
        ack().prop_map(Owned::Ack),
        (
            0..=MAX_VARINT - 300,
            prop::collection::vec(any::<u8>(), 0..300)
        )
            .prop_map(|(o, d)| Owned::Ctrl(o, d)),
        lossmap().prop_map(Owned::LossMap),
        (varint(), "\\PC{0,40}").prop_map(|(c, r)| Owned::Close(c, r)),
        any::<[u8; 8]>().prop_map(Owned::PathChallenge),
        any::<[u8; 8]>().prop_map(Owned::PathResponse),
        (
            0..MAX_VARINT - 300,
            any::<bool>(),
            prop::collection::vec(any::<u8>(), 0..300)
        )
            .prop_map(|(o, f, d)| Owned::Stream(o, f, d)),
        (varint(), lossmap())
            .prop_map(|(limit, map)| Owned::StreamAck(StreamAckFrame { limit, map })),
    ]
}

/// Frames that consume the rest of the packet.
fn last_frame() -> impl Strategy<Value = Owned> {
    prop_oneof![
        Just(Owned::Padding),
        (
            any::<u32>(),
            0..BLOCK_LIMIT,
            prop::collection::vec(any::<u8>(), 0..300)
        )
            .prop_map(|(x, b, p)| Owned::Data(x, b, p)),
    ]
}

fn any_frame() -> impl Strategy<Value = Owned> {
    prop_oneof![inner_frame(), last_frame()]
}

fn frame_seq() -> impl Strategy<Value = Vec<Owned>> {
    (
        prop::collection::vec(inner_frame(), 0..8),
        prop::option::of(last_frame()),
    )
        .prop_map(|(mut v, last)| {
            v.extend(last);
            v
        })
}

fn encode_all(frames: &[Owned]) -> Vec<u8> {
    let len: usize = frames.iter().map(|f| f.frame().encoded_len()).sum();
    let mut buf = vec![0u8; len];
    let mut w = Writer::new(&mut buf);
    for f in frames {
        f.frame().encode(&mut w).unwrap();
    }
    assert_eq!(w.pos(), len, "encoded_len disagrees with encode");
    buf
}

fn parse_all(bytes: &[u8]) -> Result<Vec<Frame<'_>>, WireError> {
    parse_frames(bytes).collect()
}

proptest! {
    #[test]
    fn single_frame_round_trips(f in any_frame()) {
        let bytes = encode_all(std::slice::from_ref(&f));
        prop_assert_eq!(bytes.len(), f.frame().encoded_len());
        prop_assert_eq!(parse_all(&bytes).unwrap(), vec![f.frame()]);
    }

    #[test]
    fn frame_sequence_round_trips(frames in frame_seq()) {
        let bytes = encode_all(&frames);
        let expect: Vec<Frame> = frames.iter().map(Owned::frame).collect();
        prop_assert_eq!(parse_all(&bytes).unwrap(), expect);
    }

    #[test]
    fn truncation_never_yields_the_same_frames(frames in frame_seq()) {
        let bytes = encode_all(&frames);
        let expect: Vec<Frame> = frames.iter().map(Owned::frame).collect();
        for cut in 0..bytes.len() {
            if let Ok(got) = parse_all(&bytes[..cut]) {
                prop_assert_ne!(&got, &expect, "cut at {}", cut);
            }
        }
    }

    #[test]
    fn encode_into_short_buffer_is_nospace_and_writes_nothing(f in any_frame(), short in 1usize..400) {
        let len = f.frame().encoded_len();
        let size = len.saturating_sub(short);
        let mut buf = vec![0xeeu8; size];
        let mut w = Writer::new(&mut buf);
        prop_assert_eq!(f.frame().encode(&mut w), Err(WireError::NoSpace));
        prop_assert_eq!(w.pos(), 0);
        prop_assert!(buf.iter().all(|&b| b == 0xee));
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..1400)) {
        for r in parse_frames(&bytes) {
            let _ = r;
        }
        let _ = peek_kind(&bytes);
        let _ = sealed_dest_cid(&bytes);
        let _ = sealed_pn_bits(&bytes);
        let _ = ClientHello::decode(&bytes);
        let _ = ServerHello::decode(&bytes);
        let _ = HelloReject::decode(&bytes);
        let _ = client_hello_ids(&bytes);
        let mut r = Reader::new(&bytes);
        while r.get_varint().is_ok() {}
    }

    #[test]
    fn random_frame_bodies_never_panic(t in 0u8..8, body in prop::collection::vec(any::<u8>(), 0..200)) {
        // Random bytes rarely start with a valid type; force one so bodies get exercised.
        let mut bytes = vec![t];
        bytes.extend_from_slice(&body);
        let n = parse_frames(&bytes).count();
        prop_assert!(n >= 1);
    }

    #[test]
    fn hello_shaped_random_bytes_never_panic(
        kind in 1u8..5,
        len in prop_oneof![Just(CLIENT_HELLO_LEN), Just(SERVER_HELLO_LEN), Just(HELLO_REJECT_LEN), 0usize..1300],
        fill in any::<u8>(),
        ver in any::<u8>(),
    ) {
        let mut b = vec![fill; len];
        for (i, v) in MAGIC.iter().chain(&[kind, ver]).enumerate() {
            if i < len { b[i] = *v; }
        }
        let _ = peek_kind(&b);
        let _ = ClientHello::decode(&b);
        let _ = ServerHello::decode(&b);
        let _ = HelloReject::decode(&b);
    }

    #[test]
    fn varint_round_trips(v in varint()) {
        let mut buf = [0u8; 8];
        let mut w = Writer::new(&mut buf);
        w.put_varint(v).unwrap();
        prop_assert_eq!(w.pos(), varint_len(v));
        let n = w.pos();
        let mut r = Reader::new(&buf[..n]);
        prop_assert_eq!(r.get_varint().unwrap(), v);
        prop_assert!(r.is_empty());
        // every strict prefix is truncated
        for cut in 0..n {
            prop_assert_eq!(Reader::new(&buf[..cut]).get_varint(), Err(WireError::Truncated));
        }
    }

    #[test]
    fn lossmap_encode_fitting_is_maximal_and_truthful(m in lossmap(), room in 0usize..200) {
        let mut buf = vec![0u8; room];
        let mut w = Writer::new(&mut buf);
        match m.encode_fitting(&mut w) {
            Err(e) => {
                prop_assert_eq!(e, WireError::NoSpace);
                prop_assert_eq!(w.pos(), 0);
                // Not even the gapless map fits.
                let empty = LossMapFrame {
                    end: m.gaps.first().map_or(m.end, |g| g.start),
                    gaps: vec![],
                    ..m.clone()
                };
                prop_assert!(empty.encoded_len() > room);
            }
            Ok(end) => {
                let n = w.pos();
                let got = parse_all(&buf[..n]).unwrap();
                prop_assert_eq!(got.len(), 1);
                let Frame::LossMap(p) = &got[0] else { panic!("not a lossmap") };
                prop_assert_eq!(p.end, end);
                let k = p.gaps.len();
                prop_assert_eq!(&p.gaps[..], &m.gaps[..k]);
                prop_assert_eq!((p.xfer, p.cum, p.start), (m.xfer, m.cum, m.start));
                if k == m.gaps.len() {
                    prop_assert_eq!(end, m.end);
                } else {
                    // Truthful: the map stops where the first omitted gap starts ...
                    prop_assert_eq!(end, m.gaps[k].start);
                    // ... and maximal: one more gap would not have fit.
                    let bigger = LossMapFrame {
                        end: m.gaps.get(k + 1).map_or(m.end, |g| g.start),
                        gaps: m.gaps[..=k].to_vec(),
                        ..m.clone()
                    };
                    prop_assert!(bigger.encoded_len() > room);
                }
            }
        }
    }

    #[test]
    fn lossmap_encoder_rejects_what_decoder_would(m in lossmap(), which in 0usize..7, i in any::<prop::sample::Index>()) {
        let mut bad = m.clone();
        let expect_err = match which {
            0 if !bad.gaps.is_empty() => { let g = i.index(bad.gaps.len()); bad.gaps[g].end = bad.gaps[g].start; true }
            1 if bad.gaps.len() >= 2 => { let g = i.index(bad.gaps.len() - 1); bad.gaps.swap(g, g + 1); true }
            2 if bad.gaps.len() >= 2 => { let g = i.index(bad.gaps.len() - 1); bad.gaps[g + 1].start = bad.gaps[g].end - 1; true }
            3 => { bad.gaps.push(bad.end..bad.end + 1); true }
            4 => { bad.cum = bad.start + 1; true }
            5 if bad.start > 0 => { bad.end = bad.start - 1; true }
            6 => { bad.top = bad.end.wrapping_sub(1); bad.end > 0 }
            _ => false,
        };
        prop_assume!(expect_err);
        let mut buf = vec![0u8; 2000];
        let mut w = Writer::new(&mut buf);
        prop_assert!(matches!(Frame::LossMap(bad.clone()).encode(&mut w), Err(WireError::BadValue(_))));
        prop_assert!(matches!(bad.encode_fitting(&mut w), Err(WireError::BadValue(_))));
        prop_assert_eq!(w.pos(), 0);
    }

    #[test]
    fn data_header_matches_frame_encoding(xfer in any::<u32>(), block in 0..BLOCK_LIMIT, payload in prop::collection::vec(any::<u8>(), 0..100)) {
        let mut a = vec![0u8; DATA_HEADER_LEN + payload.len()];
        write_data_header(&mut a, xfer, block);
        a[DATA_HEADER_LEN..].copy_from_slice(&payload);
        let mut b = vec![0u8; a.len()];
        Frame::Data { xfer, block, payload: &payload }.encode(&mut Writer::new(&mut b)).unwrap();
        prop_assert_eq!(&a, &b);
    }

    #[test]
    fn seal_open_round_trip(key in any::<[u8; 32]>(), cid in any::<u32>(), pn in any::<u64>(),
                            plain in prop::collection::vec(any::<u8>(), 0..1400)) {
        let k = PacketKey::new(&key);
        let mut buf = vec![0u8; SEALED_HEADER_LEN + plain.len() + TAG_LEN + 7];
        write_sealed_header(&mut buf, cid, pn);
        buf[SEALED_HEADER_LEN..SEALED_HEADER_LEN + plain.len()].copy_from_slice(&plain);
        let n = k.seal(&mut buf, plain.len(), pn);
        prop_assert_eq!(n, SEALED_HEADER_LEN + plain.len() + TAG_LEN);
        let pkt = &mut buf[..n];
        if plain.len() >= 16 {
            prop_assert_ne!(&pkt[SEALED_HEADER_LEN..SEALED_HEADER_LEN + plain.len()], &plain[..]);
        }
        prop_assert_eq!(peek_kind(pkt), Ok(PacketKind::Sealed));
        prop_assert_eq!(sealed_dest_cid(pkt), Ok(cid));
        prop_assert_eq!(sealed_pn_bits(pkt), Ok(pn as u32));
        prop_assert_eq!(decode_pn(pn as u32, pn.saturating_add(1)), pn);
        prop_assert!(k.open(&mut pkt.to_vec(), pn ^ (1 << 32)).is_err(), "the nonce holds the whole pn");
        prop_assert_eq!(&*k.open(pkt, pn).unwrap(), &plain[..]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn any_bit_flip_or_wrong_key_fails_open(key in any::<[u8; 32]>(), other in any::<[u8; 32]>(),
                                            pn in any::<u64>(), plain in prop::collection::vec(any::<u8>(), 0..64)) {
        prop_assume!(key != other);
        let k = PacketKey::new(&key);
        let mut sealed = vec![0u8; SEALED_HEADER_LEN + plain.len() + TAG_LEN];
        write_sealed_header(&mut sealed, 7, pn);
        sealed[SEALED_HEADER_LEN..SEALED_HEADER_LEN + plain.len()].copy_from_slice(&plain);
        k.seal(&mut sealed, plain.len(), pn);
        for bit in 0..sealed.len() * 8 {
            let mut p = sealed.clone();
            p[bit / 8] ^= 1 << (bit % 8);
            prop_assert_eq!(k.open(&mut p, pn).map(|_| ()), Err(CryptoError::Auth), "bit {}", bit);
        }
        let mut p = sealed.clone();
        prop_assert!(PacketKey::new(&other).open(&mut p, pn).is_err());
        // dropping or adding bytes at the end fails too
        let mut p = sealed.clone();
        prop_assert!(k.open(&mut p[..sealed.len() - 1], pn).is_err());
        let mut p = sealed.clone();
        p.push(0);
        prop_assert!(k.open(&mut p, pn).is_err());
        let mut p = sealed.clone();
        prop_assert!(k.open(&mut p, pn).is_ok());
    }

    /// Old pns at the far edge of the window must not leak into the bits of new ones.
    #[test]
    fn replay_window_edge_does_not_alias(h in REPLAY_WINDOW..1u64 << 40, d in REPLAY_WINDOW - 128..REPLAY_WINDOW, a in 1u64..128) {
        let mut w = ReplayWindow::new();
        w.mark(h);
        prop_assert!(w.check_and_mark(h - d));
        w.mark(h + a);
        for pn in h + 1..h + a {
            prop_assert!(w.is_fresh(pn), "pn {} wrongly seen", pn);
        }
        prop_assert!(!w.is_fresh(h - d));
    }

    /// The window against a set-based model of the spec's rule.
    #[test]
    fn replay_window_matches_model(steps in prop::collection::vec((prop_oneof![
            4 => 0u64..200,                    // near the front
            2 => 0u64..70_000,                 // anywhere in the window
            2 => 65_400u64..65_700,            // at its edge
            1 => 0u64..1_000_000,              // far jumps
        ], any::<bool>(), any::<bool>()), 1..400)) {
        let mut w = ReplayWindow::new();
        let mut seen = BTreeSet::new();
        let mut highest: Option<u64> = None;
        let mut base = 0u64;
        for (off, forward, do_mark) in steps {
            let pn = if forward { base + off } else { base.saturating_sub(off) };
            let model_fresh = !seen.contains(&pn)
                && match highest { None => true, Some(h) => pn > h || h - pn < REPLAY_WINDOW };
            prop_assert_eq!(w.is_fresh(pn), model_fresh, "pn {} highest {:?}", pn, highest);
            if do_mark && model_fresh {
                w.mark(pn);
                seen.insert(pn);
                highest = Some(highest.map_or(pn, |h| h.max(pn)));
                base = highest.unwrap();
            }
            prop_assert_eq!(w.highest(), highest);
        }
    }
}

#[test]
fn varint_boundaries() {
    let cases: [(u64, usize); 8] = [
        (0, 1),
        (63, 1),
        (64, 2),
        (16383, 2),
        (16384, 4),
        ((1 << 30) - 1, 4),
        (1 << 30, 8),
        ((1 << 62) - 1, 8),
    ];
    for (v, len) in cases {
        assert_eq!(varint_len(v), len, "{v}");
        let mut buf = [0u8; 8];
        let mut w = Writer::new(&mut buf);
        w.put_varint(v).unwrap();
        assert_eq!(w.pos(), len, "{v}");
        assert_eq!(Reader::new(&buf[..len]).get_varint().unwrap(), v);
    }
    for v in [1u64 << 62, u64::MAX] {
        let mut buf = [0u8; 8];
        let mut w = Writer::new(&mut buf);
        assert!(matches!(w.put_varint(v), Err(WireError::BadValue(_))));
        assert_eq!(w.pos(), 0);
    }
    // RFC 9000 §A.1 examples (including a non-minimal 2-byte 37).
    let examples: [(&[u8], u64); 5] = [
        (
            &[0xc2, 0x19, 0x7c, 0x5e, 0xff, 0x14, 0xe8, 0x8c],
            151_288_809_941_952_652,
        ),
        (&[0x9d, 0x7f, 0x3e, 0x7d], 494_878_333),
        (&[0x7b, 0xbd], 15_293),
        (&[0x25], 37),
        (&[0x40, 0x25], 37),
    ];
    for (bytes, v) in examples {
        let mut r = Reader::new(bytes);
        assert_eq!(r.get_varint().unwrap(), v);
        assert!(r.is_empty());
    }
    let mut buf = [0u8; 8];
    Writer::new(&mut buf)
        .put_varint(151_288_809_941_952_652)
        .unwrap();
    assert_eq!(buf, [0xc2, 0x19, 0x7c, 0x5e, 0xff, 0x14, 0xe8, 0x8c]);
}

#[test]
fn writer_and_reader_bounds() {
    let mut buf = [0u8; 3];
    let mut w = Writer::new(&mut buf);
    assert_eq!(w.put_u32(1), Err(WireError::NoSpace));
    w.put_u16(0xabcd).unwrap();
    assert_eq!(w.remaining(), 1);
    assert_eq!(w.put_u16(1), Err(WireError::NoSpace));
    assert_eq!(w.put_bytes(&[1, 2]), Err(WireError::NoSpace));
    w.put_u8(0xef).unwrap();
    assert_eq!(w.put_u8(0), Err(WireError::NoSpace));
    assert_eq!(buf, [0xab, 0xcd, 0xef]);
    let mut r = Reader::new(&buf);
    assert_eq!(r.get_u32(), Err(WireError::Truncated));
    assert_eq!(r.get_u16().unwrap(), 0xabcd);
    assert_eq!(r.get_bytes(2), Err(WireError::Truncated));
    assert_eq!(r.rest(), &[0xef]);
    assert!(r.is_empty());
}

fn lossmap_bytes(fields: &[u64]) -> Vec<u8> {
    let mut buf = vec![0u8; 100];
    let mut w = Writer::new(&mut buf);
    w.put_u8(0x05).unwrap();
    for &f in fields {
        w.put_varint(f).unwrap();
    }
    let n = w.pos();
    buf.truncate(n);
    buf
}

#[test]
fn lossmap_decoder_validation() {
    let ok = |f: &[u64]| parse_all(&lossmap_bytes(f)).map(|v| v.len());
    let bad = |f: &[u64]| {
        let b = lossmap_bytes(f);
        let r = parse_all(&b);
        assert!(r.is_err(), "{f:?} accepted: {r:?}");
    };
    // xfer, cum, top, start, end, n, (delta, len)*
    assert_eq!(ok(&[1, 5, 30, 10, 20, 2, 0, 3, 2, 5]), Ok(1)); // gaps 10..13, 15..20
    let b = lossmap_bytes(&[1, 5, 30, 10, 20, 2, 0, 3, 2, 5]);
    assert_eq!(
        parse_all(&b).unwrap(),
        vec![Frame::LossMap(LossMapFrame {
            xfer: 1,
            cum: 5,
            top: 30,
            start: 10,
            end: 20,
            gaps: vec![10..13, 15..20]
        })]
    );
    assert_eq!(ok(&[1, 5, 20, 10, 20, 0]), Ok(1)); // end == top
    bad(&[1, 5, 19, 10, 20, 0]); // end > top
    bad(&[1, 5, 30, 10, 20, 2, 0, 3, 2, 6]); // second gap past end
    bad(&[1, 5, 30, 10, 20, 1, 0, 0]); // empty gap
    bad(&[1, 11, 30, 10, 20, 0]); // cum > start
    bad(&[1, 5, 30, 21, 20, 0]); // start > end
    bad(&[1, 5, 30, 10, 20, 1, 10, 1]); // gap starting at end
    bad(&[1 << 32, 0, 0, 0, 0, 0]); // xfer beyond u32
    bad(&[1, 5, 30, 10, 20, 3, 0, 1]); // count larger than gaps present
    bad(&[1, 5, 30, 10, 20, 1_000_000]); // absurd count, no allocation bomb
    bad(&[
        1,
        0,
        MAX_VARINT,
        MAX_VARINT - 1,
        MAX_VARINT,
        1,
        MAX_VARINT,
        MAX_VARINT,
    ]); // overflow
    bad(&[1, 5, 30, 10, 20]); // truncated before n
    assert_eq!(ok(&[1, 0, 0, 0, 0, 0]), Ok(1)); // empty map
}

#[test]
#[allow(clippy::single_range_in_vec_init, clippy::reversed_empty_ranges)]
fn lossmap_encoder_validation() {
    let base = LossMapFrame {
        xfer: 3,
        cum: 0,
        top: 100,
        start: 10,
        end: 100,
        gaps: vec![],
    };
    let enc = |gaps: &[std::ops::Range<u64>]| {
        let mut buf = [0u8; 200];
        LossMapFrame {
            gaps: gaps.to_vec(),
            ..base.clone()
        }
        .encode(&mut Writer::new(&mut buf))
    };
    assert!(enc(&[10..20, 20..30, 99..100]).is_ok()); // adjacent is still disjoint
    assert!(enc(&[10..20, 15..30]).is_err()); // overlap
    assert!(enc(&[30..40, 10..20]).is_err()); // unsorted
    assert!(enc(&[10..20, 25..25]).is_err()); // empty
    assert!(enc(&[9..20]).is_err()); // before start
    assert!(enc(&[90..101]).is_err()); // past end
    assert!(enc(&[20..10]).is_err());
}

#[test]
fn padding_rules() {
    assert_eq!(parse_all(&[0, 0, 0]).unwrap(), vec![Frame::Padding]);
    assert_eq!(
        parse_all(&[1, 0, 0]).unwrap(),
        vec![Frame::Ping, Frame::Padding]
    );
    assert!(parse_all(&[1, 0, 0, 1]).is_err());
    assert_eq!(parse_all(&[]).unwrap(), vec![]);
    assert_eq!(
        parse_all(&[0x0b]).unwrap_err(),
        WireError::UnknownFrame(0x0b)
    );
    assert_eq!(parse_all(&[0x07, 1, 2]).unwrap_err(), WireError::Truncated);
    // after an error the iterator ends
    let mut it = parse_frames(&[1, 0xff, 1, 1]);
    assert_eq!(it.next(), Some(Ok(Frame::Ping)));
    assert_eq!(it.next(), Some(Err(WireError::UnknownFrame(0xff))));
    assert_eq!(it.next(), None);
    assert_eq!(it.next(), None);
}

#[test]
fn close_reason_must_be_utf8() {
    assert!(parse_all(&[6, 0, 2, 0xc3, 0x28]).is_err());
    assert_eq!(
        parse_all(&[6, 1, 2, b'o', b'k']).unwrap(),
        vec![Frame::Close {
            code: 1,
            reason: "ok"
        }]
    );
}

#[test]
fn ctrl_offset_range() {
    // offset + len beyond 2^62-1 is out of range
    let mut buf = [0u8; 20];
    let mut w = Writer::new(&mut buf);
    w.put_u8(3).unwrap();
    w.put_varint(MAX_VARINT).unwrap();
    w.put_varint(1).unwrap();
    w.put_u8(9).unwrap();
    let n = w.pos();
    assert!(parse_all(&buf[..n]).is_err());
    let mut out = [0u8; 20];
    let f = Frame::Ctrl {
        offset: MAX_VARINT,
        data: &[9],
    };
    assert!(f.encode(&mut Writer::new(&mut out)).is_err());
}

#[test]
fn ack_eliciting() {
    assert!(Frame::Ping.is_ack_eliciting());
    assert!(Frame::Ctrl {
        offset: 0,
        data: &[]
    }
    .is_ack_eliciting());
    assert!(Frame::Data {
        xfer: 0,
        block: 0,
        payload: &[]
    }
    .is_ack_eliciting());
    assert!(!Frame::Ack(AckFrame::default()).is_ack_eliciting());
    assert!(!Frame::Padding.is_ack_eliciting());
    assert!(!Frame::Close {
        code: 0,
        reason: ""
    }
    .is_ack_eliciting());
}

#[test]
fn sizes_and_kinds() {
    assert_eq!(udp_payload_limit(1500, AddrFamily::V4), 1472);
    assert_eq!(udp_payload_limit(1500, AddrFamily::V6), 1452);
    assert_eq!(block_size(1500, AddrFamily::V4), 1472 - 9 - 16 - 11);
    assert_eq!(block_size(MIN_MTU, AddrFamily::V6), 1280 - 48 - 36);
    // A full DATA packet is exactly the UDP payload limit.
    for fam in [AddrFamily::V4, AddrFamily::V6] {
        for mtu in [MIN_MTU, 1500, 9000, u16::MAX] {
            assert_eq!(
                SEALED_HEADER_LEN + DATA_HEADER_LEN + block_size(mtu, fam) + TAG_LEN,
                udp_payload_limit(mtu, fam)
            );
        }
    }
    assert!(udp_payload_limit(MIN_MTU, AddrFamily::V6) >= CLIENT_HELLO_LEN);

    assert_eq!(peek_kind(&[]), Err(WireError::Truncated));
    assert_eq!(peek_kind(&[3; 24]), Err(WireError::Truncated));
    assert_eq!(peek_kind(&[3; 25]), Ok(PacketKind::Sealed));
    assert_eq!(sealed_pn_bits(&[3; 24]), Err(WireError::Truncated));
    assert_eq!(peek_kind(b"HY"), Err(WireError::Truncated));
    assert_eq!(peek_kind(b"XYZ\x01"), Err(WireError::BadMagic));
    assert_eq!(peek_kind(b"HYT\x01"), Ok(PacketKind::ClientHello));
    assert_eq!(peek_kind(b"HYT\x02"), Ok(PacketKind::ServerHello));
    assert_eq!(peek_kind(b"HYT\x04"), Ok(PacketKind::HelloReject));
    assert_eq!(peek_kind(b"HYT\x03"), Err(WireError::UnknownKind(3)));
    assert_eq!(peek_kind(b"HYT\x09"), Err(WireError::UnknownKind(9)));

    let mut h = [0u8; 40];
    write_sealed_header(&mut h, 0x0102_0304, 0x1112_1314_1516_1718);
    assert_eq!(h[..9], [3, 1, 2, 3, 4, 0x15, 0x16, 0x17, 0x18]);
    assert_eq!(sealed_dest_cid(&h), Ok(0x0102_0304));
    assert_eq!(sealed_pn_bits(&h), Ok(0x1516_1718));

    let mut d = [0u8; DATA_HEADER_LEN];
    write_data_header(&mut d, 0x0a0b_0c0d, 0x0102_0304_0506);
    assert_eq!(d, [4, 0x0a, 0x0b, 0x0c, 0x0d, 1, 2, 3, 4, 5, 6]);
    let big = Frame::Data {
        xfer: 1,
        block: BLOCK_LIMIT,
        payload: &[],
    };
    let mut b = [0u8; 32];
    assert!(matches!(
        big.encode(&mut Writer::new(&mut b)),
        Err(WireError::BadValue(_))
    ));
}

#[test]
#[should_panic]
fn data_header_panics_on_a_block_beyond_six_bytes() {
    write_data_header(&mut [0u8; DATA_HEADER_LEN], 1, BLOCK_LIMIT);
}

/// RFC 9000 A.3's worked example, the edges of the 32-bit window, and the start.
#[test]
fn packet_numbers_are_recovered_from_their_low_half() {
    assert_eq!(decode_pn(0, 0), 0);
    assert_eq!(decode_pn(5, 0), 5);
    // A reordered packet from before a wrap, and one from after it.
    let w = 1u64 << 32;
    assert_eq!(decode_pn(0xffff_fff0, w + 3), w - 16);
    assert_eq!(decode_pn(3, w - 16), w + 3);
    // Up to half the window either side of the expected pn.
    let e = 7 * w + 100;
    assert_eq!(decode_pn((e + w / 2) as u32, e), e + w / 2);
    assert_eq!(decode_pn((e - w / 2 + 1) as u32, e), e - w / 2 + 1);
    // Near the top of the space nothing overflows.
    assert_eq!(decode_pn(u32::MAX, u64::MAX), u64::MAX);
    assert_eq!(decode_pn(0, u64::MAX), u64::MAX - u64::from(u32::MAX));
}

proptest! {
    #[test]
    fn decode_pn_inverts_truncation_near_the_expected(expected in 0u64..1 << 62, d in -(1i64 << 31) + 1..1i64 << 31) {
        let pn = expected.saturating_add_signed(d);
        prop_assert_eq!(decode_pn(pn as u32, expected), pn);
    }
}

#[test]
fn seal_uses_pn_nonce_and_header_aad() {
    let k = PacketKey::new(&[7; 32]);
    let seal = |cid: u32, pn: u64| {
        let mut b = [0u8; SEALED_HEADER_LEN + 4 + TAG_LEN];
        write_sealed_header(&mut b, cid, pn);
        b[9..13].copy_from_slice(b"abcd");
        k.seal(&mut b, 4, pn);
        b
    };
    // Different pn: different ciphertext (nonce); different cid alone: same ciphertext
    // (cid is only AAD) but different tag.
    let a = seal(1, 1);
    let b = seal(1, 2);
    let c = seal(2, 1);
    assert_ne!(a[9..13], b[9..13]);
    assert_eq!(a[9..13], c[9..13]);
    assert_ne!(a[13..], c[13..]);
    // A packet moved to another pn does not open, in the header or only in the high half
    // the receiver infers.
    let mut moved = a;
    moved[5..9].copy_from_slice(&2u32.to_be_bytes());
    assert!(k.open(&mut moved, 2).is_err());
    assert!(k.open(&mut a.clone(), 1 + (1 << 32)).is_err());
    assert!(k.open(&mut a.clone(), 1).is_ok());
    let mut short = [3u8; 24];
    assert_eq!(k.open(&mut short, 0), Err(CryptoError::TooShort));
}

#[test]
#[should_panic]
fn seal_panics_on_small_buffer() {
    let k = PacketKey::new(&[7; 32]);
    let mut b = [0u8; SEALED_HEADER_LEN + 10 + TAG_LEN - 1];
    k.seal(&mut b, 10, 0);
}

#[test]
fn replay_window_basics() {
    let mut w = ReplayWindow::new();
    assert_eq!(w.highest(), None);
    assert!(w.is_fresh(0));
    w.mark(0);
    assert!(!w.is_fresh(0));
    // out of order within the window
    w.mark(10);
    for pn in 1..10 {
        assert!(w.is_fresh(pn));
    }
    w.mark(5);
    assert!(!w.is_fresh(5));
    assert!(w.is_fresh(4));
    assert_eq!(w.highest(), Some(10));
    // big jump forward
    let far = 10 + 5 * REPLAY_WINDOW + 3;
    assert!(w.check_and_mark(far));
    assert!(!w.check_and_mark(far));
    assert_eq!(w.highest(), Some(far));
    assert!(!w.is_fresh(10)); // far-old
    assert!(!w.is_fresh(far - REPLAY_WINDOW));
    assert!(w.is_fresh(far - REPLAY_WINDOW + 1));
    assert!(w.is_fresh(far - 1));
    // marking a too-old pn changes nothing
    w.mark(3);
    assert_eq!(w.highest(), Some(far));
    // pn near u64::MAX does not overflow
    w.mark(u64::MAX);
    assert!(!w.is_fresh(u64::MAX));
    assert!(w.is_fresh(u64::MAX - 1));
}
