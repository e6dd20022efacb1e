//! Handshake: key agreement, authentication failures, rejects, mtu negotiation, byte layouts,
//! and an independent re-derivation of the PROTOCOL.md key schedule.

use hayate_proto::crypto::{PacketKey, Psk};
use hayate_proto::handshake::{
    hello_reject, server_accept, ClientHandshake, HandshakeError, ServerAccept,
};
use hayate_proto::wire::*;
use ring::hmac;
use x25519_dalek::{PublicKey, StaticSecret};

// Anti-amplification: every reply is smaller than the hello that caused it.
const _: () = assert!(SERVER_HELLO_LEN < CLIENT_HELLO_LEN && HELLO_REJECT_LEN < CLIENT_HELLO_LEN);

fn psk(b: u8) -> Psk {
    Psk::from_bytes([b; 32])
}

/// Seals `msg` with `tx` and opens it with `rx`; Some(plaintext) if it opened.
fn transfer(tx: &PacketKey, rx: &PacketKey, pn: u64, msg: &[u8]) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; SEALED_HEADER_LEN + msg.len() + TAG_LEN];
    write_sealed_header(&mut buf, 42, pn);
    buf[SEALED_HEADER_LEN..SEALED_HEADER_LEN + msg.len()].copy_from_slice(msg);
    let n = tx.seal(&mut buf, msg.len(), pn);
    rx.open(&mut buf[..n], pn).ok().map(|p| p.to_vec())
}

fn accept(p: &Psk, hello: &[u8], max_mtu: u16) -> ServerAccept {
    server_accept(p, hello, max_mtu, AddrFamily::V4).expect("server accepts")
}

#[test]
fn client_and_server_agree_on_keys() {
    let p = psk(1);
    let c = ClientHandshake::new(&p, 1500);
    let s = accept(&p, &c.datagram(AddrFamily::V4), 9000);
    assert_eq!(s.client_cid, c.client_cid());
    assert_eq!(s.client_random[..], c.hello()[13..45]);
    let e = c.handle(&p, &s.reply_datagram()).expect("client accepts");
    assert_eq!(e.server_cid, s.server_cid);
    assert_eq!((e.mtu, s.mtu), (1500, 1500));

    let msg = b"put /a/b 123 bytes";
    assert_eq!(
        transfer(&e.keys.send, &s.keys.recv, 0, msg).as_deref(),
        Some(&msg[..])
    );
    assert_eq!(
        transfer(&s.keys.send, &e.keys.recv, 0, msg).as_deref(),
        Some(&msg[..])
    );
    // The two directions use different keys.
    assert_eq!(transfer(&e.keys.send, &e.keys.recv, 0, msg), None);
    assert_eq!(transfer(&s.keys.send, &s.keys.recv, 0, msg), None);
}

#[test]
fn every_session_gets_fresh_keys_and_ids() {
    let p = psk(1);
    let c1 = ClientHandshake::new(&p, 1500);
    let c2 = ClientHandshake::new(&p, 1500);
    assert_ne!(c1.client_cid(), c2.client_cid());
    assert_ne!(c1.hello(), c2.hello());
    // The hello is built once: retransmissions are byte-identical.
    assert_eq!(c1.hello(), c1.hello());
    let s1 = accept(&p, &c1.datagram(AddrFamily::V4), 1500);
    let s2 = accept(&p, &c2.datagram(AddrFamily::V4), 1500);
    assert_ne!(s1.server_cid, s2.server_cid);
    assert_eq!(transfer(&s1.keys.send, &s2.keys.send, 0, b"x"), None);
    // A replayed hello yields a distinct session: the server must cache its first reply.
    let s1b = accept(&p, &c1.datagram(AddrFamily::V4), 1500);
    assert_ne!(s1.reply, s1b.reply);
}

#[test]
fn wrong_psk_is_rejected_with_auth_failed() {
    let c = ClientHandshake::new(&psk(1), 1500);
    let err = server_accept(&psk(2), c.hello(), 1500, AddrFamily::V4).unwrap_err();
    assert!(matches!(err, HandshakeError::BadMac), "{err:?}");
    let rj = hello_reject(c.hello(), RejectReason::AuthFailed).expect("ids readable");
    assert_eq!(rj.len(), HELLO_REJECT_LEN);
    assert!(matches!(
        c.handle(&psk(1), &rj),
        Err(HandshakeError::Rejected(RejectReason::AuthFailed))
    ));
}

#[test]
fn server_with_other_key_cannot_complete() {
    // Even if a server with another key answered (it would not), its hello would not verify.
    let c = ClientHandshake::new(&psk(1), 1500);
    let forged = {
        // Re-MAC the hello under psk(2) so that server accepts it.
        let mut h = c.hello().to_vec();
        let k = hello_key(&psk(2));
        let tag = hmac::sign(&k, &h[..CLIENT_HELLO_MAC_OFFSET]);
        h[CLIENT_HELLO_MAC_OFFSET..].copy_from_slice(tag.as_ref());
        h
    };
    let s = accept(&psk(2), &forged, 1500);
    assert!(matches!(
        c.handle(&psk(1), &s.reply),
        Err(HandshakeError::BadMac)
    ));
}

#[test]
fn tampered_server_hello_is_refused_and_genuine_one_still_works() {
    let p = psk(3);
    let c = ClientHandshake::new(&p, 1500);
    let s = accept(&p, &c.datagram(AddrFamily::V4), 1500);
    for i in 0..SERVER_HELLO_LEN {
        for bit in [0x01u8, 0x80] {
            let mut t = s.reply_datagram();
            t[i] ^= bit;
            let r = c.handle(&p, &t);
            assert!(r.is_err(), "byte {i} bit {bit:#x} accepted");
            // Fields the MAC covers (beyond the cid the client matches first, and the server
            // cid's zero high half that decoding refuses) fail as BadMac.
            if (17..85).contains(&i) || i >= SERVER_HELLO_MAC_OFFSET {
                assert!(matches!(r, Err(HandshakeError::BadMac)), "byte {i}: {r:?}");
            }
        }
    }
    // Nothing was consumed by the failures.
    let e = c.handle(&p, &s.reply_datagram()).expect("genuine hello");
    assert_eq!(e.server_cid, s.server_cid);
    assert_eq!(
        transfer(&e.keys.send, &s.keys.recv, 1, b"ok").as_deref(),
        Some(&b"ok"[..])
    );
    // Wrong length is malformed.
    assert!(matches!(
        c.handle(&p, &s.reply[..119]),
        Err(HandshakeError::Malformed(WireError::Truncated))
    ));
}

#[test]
fn server_hello_for_another_hello_is_refused() {
    let p = psk(3);
    let c1 = ClientHandshake::new(&p, 1500);
    let c2 = ClientHandshake::new(&p, 1500);
    let s2 = accept(&p, &c2.datagram(AddrFamily::V4), 1500);
    assert!(matches!(
        c1.handle(&p, &s2.reply_datagram()),
        Err(HandshakeError::UnexpectedPacket)
    ));
    // Same cid spliced in: the MAC (over our hello) still fails.
    let mut spliced = s2.reply_datagram();
    spliced[5..13].copy_from_slice(&u64::from(c1.client_cid()).to_be_bytes());
    assert!(matches!(
        c1.handle(&p, &spliced),
        Err(HandshakeError::BadMac)
    ));
}

#[test]
fn forged_rejects_are_ignored() {
    let p = psk(4);
    let c = ClientHandshake::new(&p, 1500);
    let other = ClientHandshake::new(&p, 1500);
    // A reject for someone else's hello.
    let rj = hello_reject(other.hello(), RejectReason::Busy).unwrap();
    assert!(matches!(
        c.handle(&p, &rj),
        Err(HandshakeError::UnexpectedPacket)
    ));
    // Our cid but a guessed random.
    let forged = HelloReject {
        client_cid: u64::from(c.client_cid()),
        client_random: [0; 32],
        reason: RejectReason::AuthFailed,
        max_version: 1,
    }
    .encode();
    assert!(matches!(c.handle(&p, &forged), Err(HandshakeError::BadMac)));
    // One bit off in the echoed random.
    let mut rj = hello_reject(c.hello(), RejectReason::Busy).unwrap();
    rj[20] ^= 4;
    assert!(matches!(c.handle(&p, &rj), Err(HandshakeError::BadMac)));
    // Bad reason byte.
    let mut rj = hello_reject(c.hello(), RejectReason::Busy).unwrap();
    rj[45] = 9;
    assert!(matches!(
        c.handle(&p, &rj),
        Err(HandshakeError::Malformed(_))
    ));
    // The genuine path still works afterwards.
    let s = accept(&p, &c.datagram(AddrFamily::V4), 1500);
    assert!(c.handle(&p, &s.reply_datagram()).is_ok());
}

#[test]
fn non_handshake_packets_are_unexpected() {
    let p = psk(5);
    let c = ClientHandshake::new(&p, 1500);
    let mut sealed = [0u8; 60];
    write_sealed_header(&mut sealed, c.client_cid(), 0);
    assert!(matches!(
        c.handle(&p, &sealed),
        Err(HandshakeError::UnexpectedPacket)
    ));
    assert!(matches!(
        c.handle(&p, c.hello()),
        Err(HandshakeError::UnexpectedPacket)
    ));
    assert!(matches!(
        c.handle(&p, b"garbage"),
        Err(HandshakeError::Malformed(_))
    ));
    assert!(matches!(
        c.handle(&p, &[]),
        Err(HandshakeError::Malformed(_))
    ));
}

#[test]
fn mtu_negotiation() {
    let p = psk(6);
    let cases = [
        (9000, 1500, 1500),
        (1400, 9000, 1400),
        (1500, 1500, 1500),
        (9000, 1000, MIN_MTU), // server limit below the floor is raised to it
        (500, 9000, MIN_MTU),  // so is the client's
        (u16::MAX, u16::MAX, u16::MAX),
    ];
    for (client, server, expect) in cases {
        let c = ClientHandshake::new(&p, client);
        let hello_mtu = u16::from_be_bytes([c.hello()[77], c.hello()[78]]);
        assert_eq!(hello_mtu, client.max(MIN_MTU));
        let s = accept(&p, &c.datagram(AddrFamily::V4), server);
        assert_eq!(s.mtu, expect, "{client} {server}");
        assert_eq!(u16::from_be_bytes([s.reply[85], s.reply[86]]), expect);
        assert_eq!(c.handle(&p, &s.reply_datagram()).unwrap().mtu, expect);
    }
}

#[test]
fn malformed_client_hellos() {
    let p = psk(7);
    let c = ClientHandshake::new(&p, 1500);
    let h = c.hello();
    let malformed = |d: &[u8]| {
        matches!(
            server_accept(&p, d, 1500, AddrFamily::V4),
            Err(HandshakeError::Malformed(_))
        )
    };
    assert!(malformed(&h[..1199]));
    // Bytes after the fields are padding (it proves the path's MTU): zeros only.
    let mut long = h.to_vec();
    long.extend([0; 300]);
    assert!(!malformed(&long));
    long.push(1);
    assert!(malformed(&long));
    let mut pad = h.to_vec();
    pad[500] = 1;
    assert!(malformed(&pad));
    let mut magic = h.to_vec();
    magic[0] = b'X';
    assert!(malformed(&magic));
    assert!(hello_reject(&magic, RejectReason::AuthFailed).is_none());
    let mut low_mtu = h.to_vec();
    low_mtu[77..79].copy_from_slice(&1279u16.to_be_bytes());
    assert!(malformed(&low_mtu));
    // MAC-covered bytes: any flip is BadMac.
    let mut wide_cid = h.to_vec();
    wide_cid[5] ^= 0x01;
    assert!(malformed(&wide_cid));
    for i in [12, 13, 44, 45, 76, 78, 1168, 1199] {
        let mut t = h.to_vec();
        t[i] ^= 0x01;
        assert!(
            matches!(
                server_accept(&p, &t, 1500, AddrFamily::V4),
                Err(HandshakeError::BadMac)
            ),
            "byte {i}"
        );
    }
    // Too short to be a hello: no reject (it would amplify).
    assert!(hello_reject(&h[..1199], RejectReason::AuthFailed).is_none());
}

#[test]
fn unsupported_version_gets_a_version_reject() {
    let p = psk(8);
    let c = ClientHandshake::new(&p, 1500);
    let mut h = c.hello().to_vec();
    h[4] = VERSION + 1;
    assert!(matches!(
        server_accept(&p, &h, 1500, AddrFamily::V4),
        Err(HandshakeError::UnsupportedVersion(v)) if v == VERSION + 1
    ));
    assert_eq!(
        ClientHello::decode(&h),
        Err(WireError::UnsupportedVersion(VERSION + 1))
    );
    assert_eq!(
        client_hello_ids(&h),
        Some((u64::from(c.client_cid()), h[13..45].try_into().unwrap()))
    );
    let rj = hello_reject(&h, RejectReason::VersionUnsupported).unwrap();
    let parsed = HelloReject::decode(&rj).unwrap();
    assert_eq!(parsed.max_version, u16::from(VERSION));
    assert!(matches!(
        c.handle(&p, &rj),
        Err(HandshakeError::Rejected(RejectReason::VersionUnsupported))
    ));
}

#[test]
fn client_hello_layout_is_byte_exact() {
    let p = psk(9);
    let c = ClientHandshake::new(&p, 0x2345);
    let h = c.hello();
    assert_eq!(h.len(), 1200);
    assert_eq!(&h[0..3], b"HYT");
    assert_eq!(h[3], 0x01);
    assert_eq!(h[4], 0x0d);
    assert_eq!(h[5..13], u64::from(c.client_cid()).to_be_bytes());
    assert_eq!(h[77..79], [0x23, 0x45]);
    assert!(h[79..1168].iter().all(|&b| b == 0));
    let tag = hmac::sign(&hello_key(&p), &h[..1168]);
    assert_eq!(&h[1168..], tag.as_ref());

    let ch = ClientHello {
        client_cid: 0x0506_0708,
        client_random: [0xaa; 32],
        client_eph: [0xbb; 32],
        mtu: 0x1234,
        token: [0xdd; 32],
        mac: [0xcc; 32],
    };
    let b = ch.encode();
    assert_eq!(b.len(), CLIENT_HELLO_LEN);
    assert_eq!(&b[..5], b"HYT\x01\x0d");
    assert_eq!(b[5..13], [0, 0, 0, 0, 5, 6, 7, 8]);
    assert_eq!(b[13..45], [0xaa; 32]);
    assert_eq!(b[45..77], [0xbb; 32]);
    assert_eq!(b[77..79], [0x12, 0x34]);
    assert_eq!(b[79..111], [0xdd; 32]);
    assert!(b[111..1168].iter().all(|&x| x == 0));
    assert_eq!(b[1168..1200], [0xcc; 32]);
    assert_eq!(ClientHello::decode(&b).unwrap(), ch);
    // A cid of more than 32 bits (version 1 had 64) is refused.
    let mut wide = b;
    wide[8] = 1;
    assert_eq!(
        ClientHello::decode(&wide),
        Err(WireError::BadValue("cid wider than 32 bits"))
    );
}

#[test]
fn server_hello_and_reject_layouts_are_byte_exact() {
    let sh = ServerHello {
        client_cid: 0x0506_0708,
        server_cid: 0x1516_1718,
        server_random: [0xaa; 32],
        server_eph: [0xbb; 32],
        mtu: 0x1234,
        mac: [0xcc; 32],
    };
    let b = sh.encode();
    assert_eq!(b.len(), 120);
    assert_eq!(&b[..5], b"HYT\x02\x0d");
    assert_eq!(b[5..13], [0, 0, 0, 0, 5, 6, 7, 8]);
    assert_eq!(b[13..21], [0, 0, 0, 0, 0x15, 0x16, 0x17, 0x18]);
    assert_eq!(b[21..53], [0xaa; 32]);
    assert_eq!(b[53..85], [0xbb; 32]);
    assert_eq!(b[85..87], [0x12, 0x34]);
    assert_eq!(b[87], 0);
    assert_eq!(b[88..120], [0xcc; 32]);
    assert_eq!(ServerHello::decode(&b).unwrap(), sh);
    let mut r = b;
    r[87] = 1;
    assert!(ServerHello::decode(&r).is_err());
    let mut r = b;
    r[16] = 1;
    assert!(ServerHello::decode(&r).is_err());

    let rj = HelloReject {
        client_cid: 0x0102_0304_0506_0708,
        client_random: [0xaa; 32],
        reason: RejectReason::Busy,
        max_version: 0x0102,
    };
    let b = rj.encode();
    assert_eq!(b.len(), 48);
    assert_eq!(&b[..5], b"HYT\x04\x0d");
    assert_eq!(b[5..13], [1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(b[13..45], [0xaa; 32]);
    assert_eq!(b[45], 3);
    assert_eq!(b[46..48], [1, 2]);
    assert_eq!(HelloReject::decode(&b).unwrap(), rj);
    // Any version's reject is read: a newer server can say what it wants.
    let mut newer = b;
    newer[4] = VERSION + 1;
    assert_eq!(HelloReject::decode(&newer).unwrap(), rj);

    // A real reply has the same shape.
    let p = psk(10);
    let c = ClientHandshake::new(&p, 1500);
    let s = accept(&p, &c.datagram(AddrFamily::V4), 1500);
    assert_eq!(&s.reply[..5], b"HYT\x02\x0d");
    assert_eq!(s.reply[5..13], u64::from(c.client_cid()).to_be_bytes());
    assert_eq!(s.reply[13..21], u64::from(s.server_cid).to_be_bytes());
    assert_eq!(s.reply[87], 0);
}

// ---- independent re-derivation of the spec's key schedule (HKDF from raw HMAC) ----

fn hkdf_extract(salt: &[u8], ikm: &[u8]) -> [u8; 32] {
    let t = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, salt), ikm);
    t.as_ref().try_into().unwrap()
}

/// HKDF-Expand for L = 32: T(1) = HMAC(prk, info ‖ 0x01).
fn hkdf_expand32(prk: &[u8; 32], info: &[u8]) -> [u8; 32] {
    let mut m = info.to_vec();
    m.push(1);
    let t = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, prk), &m);
    t.as_ref().try_into().unwrap()
}

fn hello_key(p: &Psk) -> hmac::Key {
    let prk = hkdf_extract(b"hayate v1 hello", p.as_bytes());
    hmac::Key::new(hmac::HMAC_SHA256, &hkdf_expand32(&prk, b"client hello mac"))
}

#[test]
fn hkdf_helper_matches_rfc5869_case_1() {
    let ikm = [0x0bu8; 22];
    let salt: Vec<u8> = (0x00..=0x0c).collect();
    let prk = hkdf_extract(&salt, &ikm);
    assert_eq!(
        hex(&prk),
        "077709362c2e32df0ddc3f0dc47bba6390b6c73bb50f9c3122ec844ad7c2b3e5"
    );
    let info: Vec<u8> = (0xf0..=0xf9).collect();
    assert_eq!(
        hex(&hkdf_expand32(&prk, &info)),
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"
    );
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn key_schedule_matches_the_spec() {
    let p = psk(11);
    let eph = StaticSecret::from([0x42; 32]);
    let client_random = [0x17u8; 32];
    let ch = ClientHello {
        client_cid: 77,
        client_random,
        client_eph: PublicKey::from(&eph).to_bytes(),
        mtu: 1500,
        token: [0; 32],
        mac: [0; 32],
    };
    let mut hello = ch.encode();
    let tag = hmac::sign(&hello_key(&p), &hello[..1168]);
    hello[1168..].copy_from_slice(tag.as_ref());

    let s = accept(&p, &hello, 1500);
    let sh = ServerHello::decode(&s.reply).unwrap();
    assert_eq!(sh.client_cid, 77);

    let dh = eph.diffie_hellman(&PublicKey::from(sh.server_eph));
    let salt = [client_random, sh.server_random].concat();
    let ikm = [&p.as_bytes()[..], dh.as_bytes()].concat();
    let prk = hkdf_extract(&salt, &ikm);
    let c2s = hkdf_expand32(&prk, b"hayate v1 c2s");
    let s2c = hkdf_expand32(&prk, b"hayate v1 s2c");
    let shk = hkdf_expand32(&prk, b"hayate v1 server hello");

    let mac_input = [&hello[..], &s.reply[..88]].concat();
    let expect_mac = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &shk), &mac_input);
    assert_eq!(&s.reply[88..], expect_mac.as_ref());

    assert_eq!(
        transfer(&PacketKey::new(&c2s), &s.keys.recv, 9, b"c2s").as_deref(),
        Some(&b"c2s"[..])
    );
    assert_eq!(
        transfer(&s.keys.send, &PacketKey::new(&s2c), 9, b"s2c").as_deref(),
        Some(&b"s2c"[..])
    );
}

#[test]
fn low_order_ephemeral_is_refused() {
    // All-zero public key is a low-order point: DH would be all zeros.
    let p = psk(12);
    let ch = ClientHello {
        client_cid: 1,
        client_random: [1; 32],
        client_eph: [0; 32],
        mtu: 1500,
        token: [0; 32],
        mac: [0; 32],
    };
    let mut hello = ch.encode();
    let tag = hmac::sign(&hello_key(&p), &hello[..1168]);
    hello[1168..].copy_from_slice(tag.as_ref());
    assert!(matches!(
        server_accept(&p, &hello, 1500, AddrFamily::V4),
        Err(HandshakeError::Malformed(_))
    ));
}

/// Path MTU discovery is folded into the handshake: each hello is padded to the MTU it
/// offers or agrees, so its arrival proves the path carries datagrams that big.
#[test]
fn the_hellos_padding_proves_the_mtu_each_way() {
    use AddrFamily::{V4, V6};
    let p = psk(13);
    let c = ClientHandshake::new(&p, 9000);
    let d = c.datagram(V4);
    assert_eq!(d.len(), 9000 - 28);
    assert_eq!(&d[..CLIENT_HELLO_LEN], c.hello());
    let s = accept(&p, &d, u16::MAX);
    assert_eq!(s.mtu, 9000);
    assert_eq!(s.reply_datagram().len(), 9000 - 28);
    assert_eq!(c.handle(&p, &s.reply_datagram()).unwrap().mtu, 9000);

    // Only 1472 bytes of it came (a path of 1500): the server agrees what the size proved,
    // and its reply, never longer than the hello, proves the same back.
    let s = accept(&p, &d[..1472], u16::MAX);
    assert_eq!((s.mtu, s.reply_len), (1500, 1472));
    assert_eq!(c.handle(&p, &s.reply_datagram()).unwrap().mtu, 1500);

    // A reply is never longer than the hello it answers: no amplification.
    for len in [1232, 1252, 1400, 1472, 4000, 8972] {
        for fam in [V4, V6] {
            let s = server_accept(&p, &d[..len], u16::MAX, fam).unwrap();
            assert!(s.reply_len <= len, "{len} {fam:?}");
            assert!(s.mtu >= MIN_MTU);
        }
    }

    // A ServerHello without the padding its mtu needs proves nothing of the way back.
    let s = accept(&p, &d, u16::MAX);
    assert!(matches!(
        c.handle(&p, &s.reply),
        Err(HandshakeError::Malformed(_))
    ));
    assert!(matches!(
        c.handle(&p, &s.reply_datagram()[..4000]),
        Err(HandshakeError::Malformed(_))
    ));
    // Nor does non-zero padding pass.
    let mut r = s.reply_datagram();
    *r.last_mut().unwrap() = 1;
    assert!(matches!(
        c.handle(&p, &r),
        Err(HandshakeError::Malformed(_))
    ));

    // IPv6: 48 bytes of headers.
    let d6 = c.datagram(V6);
    assert_eq!(d6.len(), 9000 - 48);
    let s = server_accept(&p, &d6, u16::MAX, V6).unwrap();
    assert_eq!((s.mtu, s.reply_len), (9000, 9000 - 48));
    assert_eq!(c.handle(&p, &s.reply_datagram()).unwrap().mtu, 9000);
    // A dual-stack server sees an IPv4 client as IPv6 and pads 20 bytes less: still taken.
    let s = server_accept(&p, &d, u16::MAX, V6).unwrap();
    assert_eq!((s.mtu, s.reply_len), (9000, 9000 - 48));
    assert_eq!(c.handle(&p, &s.reply_datagram()).unwrap().mtu, 9000);
}

/// A smaller attempt of the same handshake: the same cid, a new random and key, so a
/// server answers it as a new hello; each attempt takes only the replies to its own hello.
#[test]
fn a_smaller_attempt_is_a_new_hello_with_the_same_cid() {
    let p = psk(14);
    let big = ClientHandshake::new(&p, 9000);
    let small = big.retry_smaller(&p, 1500, &mut hayate_proto::rng::Rng::os());
    assert_eq!(big.client_cid(), small.client_cid());
    assert_eq!(small.mtu(), 1500);
    assert_ne!(big.hello()[13..45], small.hello()[13..45]);
    let s_small = accept(&p, &small.datagram(AddrFamily::V4), u16::MAX);
    let s_big = accept(&p, &big.datagram(AddrFamily::V4), u16::MAX);
    assert!(matches!(
        big.handle(&p, &s_small.reply_datagram()),
        Err(HandshakeError::BadMac)
    ));
    assert_eq!(
        small.handle(&p, &s_small.reply_datagram()).unwrap().mtu,
        1500
    );
    assert_eq!(big.handle(&p, &s_big.reply_datagram()).unwrap().mtu, 9000);
}
