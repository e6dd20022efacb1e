//! Pre-shared key, per-packet AEAD (AES-256-GCM, sealed in place) and the replay window.

use std::fmt;
use std::sync::Arc;

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use ring::rand::{SecureRandom, SystemRandom};

use crate::wire::{SEALED_HEADER_LEN, TAG_LEN};

/// First token of the key line in a key file.
pub const KEY_FILE_TAG: &str = "hayate-key-v1";

/// The 256-bit pre-shared key both sides hold.
#[derive(Clone, PartialEq, Eq)]
pub struct Psk([u8; 32]);

/// Why a key file could not be read.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum KeyFileError {
    /// No key line at all.
    #[error("no `hayate-key-v1 <hex>` line found in the key file")]
    Missing,
    /// A key line that does not have the expected shape.
    #[error("malformed key file: {0}")]
    BadFormat(&'static str),
    /// The key has characters other than hex digits.
    #[error("the key is not hexadecimal")]
    BadHex,
    /// The key is not 32 bytes (the count is of hex digits).
    #[error("the key has {0} hex digits, expected 64")]
    WrongLength(usize),
}

impl Psk {
    /// The key from its 32 bytes.
    pub fn from_bytes(b: [u8; 32]) -> Self {
        Psk(b)
    }

    /// The key's 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A fresh random key. Panics only if the OS random source fails, which ring treats as
    /// unrecoverable too.
    pub fn generate() -> Self {
        let mut b = [0u8; 32];
        fill_random(&mut b);
        Psk(b)
    }

    /// Parses a key file: `#` comment lines and blank lines, then exactly one line
    /// `hayate-key-v1 <64 hex digits>` (lowercase as written; uppercase tolerated).
    pub fn parse_key_file(text: &str) -> Result<Self, KeyFileError> {
        let mut lines = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'));
        let line = lines.next().ok_or(KeyFileError::Missing)?;
        if lines.next().is_some() {
            return Err(KeyFileError::BadFormat("more than one key line"));
        }
        let mut tokens = line.split_whitespace();
        if tokens.next() != Some(KEY_FILE_TAG) {
            return Err(KeyFileError::BadFormat(
                "key line must start with `hayate-key-v1`",
            ));
        }
        let hex = tokens
            .next()
            .ok_or(KeyFileError::BadFormat("no key after `hayate-key-v1`"))?;
        if tokens.next().is_some() {
            return Err(KeyFileError::BadFormat("extra text after the key"));
        }
        if !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err(KeyFileError::BadHex);
        }
        if hex.len() != 64 {
            return Err(KeyFileError::WrongLength(hex.len()));
        }
        let mut b = [0u8; 32];
        for (out, pair) in b.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
            *out = (hex_val(pair[0]) << 4) | hex_val(pair[1]);
        }
        Ok(Psk(b))
    }

    /// The key as a key file's contents (`hayate-key-v1 <64 hex digits>` and a newline).
    pub fn to_key_file_string(&self) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(100);
        s.push_str("# hayate pre-shared key; keep it secret\n");
        s.push_str(KEY_FILE_TAG);
        s.push(' ');
        for &byte in &self.0 {
            s.push(DIGITS[usize::from(byte >> 4)] as char);
            s.push(DIGITS[usize::from(byte & 0xf)] as char);
        }
        s.push('\n');
        s
    }
}

fn hex_val(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        b'A'..=b'F' => c - b'A' + 10,
        _ => unreachable!("checked by caller"),
    }
}

impl fmt::Debug for Psk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Psk(<redacted>)")
    }
}

impl Drop for Psk {
    fn drop(&mut self) {
        // Best effort: volatile so the wipe is not optimised away.
        for b in &mut self.0 {
            // SAFETY: `b` is a valid, aligned, exclusive reference.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

/// Fills `buf` from the OS CSPRNG. Panics if it fails (nothing sensible to do then).
pub(crate) fn fill_random(buf: &mut [u8]) {
    SystemRandom::new()
        .fill(buf)
        .expect("OS random number generator failed");
}

/// Why a packet could not be opened.
#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq)]
pub enum CryptoError {
    /// Too short to hold a sealed header and a tag.
    #[error("packet shorter than header + tag")]
    TooShort,
    /// The tag does not verify: corrupted, forged, or sealed under another key.
    #[error("packet failed to authenticate")]
    Auth,
}

/// A sealed datagram opened in place under a session's receive key
/// ([`PacketKey::open_datagram`]): its packet number, and the plaintext's length after the
/// header. Only this module makes one; a driver that opens off the protocol's thread hands
/// it to the core with the datagram (`Connection::handle_opened_at`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    pn: u64,
    plain_len: usize,
}

impl Opened {
    /// The packet number it opened under.
    pub fn pn(&self) -> u64 {
        self.pn
    }

    /// The plaintext's length; it starts right after the sealed header.
    pub fn plain_len(&self) -> usize {
        self.plain_len
    }
}

/// One direction's AES-256-GCM key.
pub struct PacketKey(LessSafeKey);

impl fmt::Debug for PacketKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PacketKey(<redacted>)")
    }
}

// The full 64-bit pn, though the header carries only its low half: the nonce never repeats
// under one key, and a receiver that guesses the high half wrong fails to open the packet.
fn nonce(pn: u64) -> Nonce {
    let mut n = [0u8; aead::NONCE_LEN];
    n[4..].copy_from_slice(&pn.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

impl PacketKey {
    /// The key from its 32 bytes (AES-256-GCM).
    pub fn new(key: &[u8; 32]) -> Self {
        PacketKey(LessSafeKey::new(
            UnboundKey::new(&AES_256_GCM, key).expect("32-byte key fits AES-256"),
        ))
    }

    /// `packet[..9]` holds the sealed header (kind, dest_cid, low half of `pn`),
    /// `packet[9..9+plain_len]` the plaintext. Encrypts in place and writes the tag after it;
    /// returns the datagram length `9 + plain_len + 16`. Nonce = `0u32 ‖ pn`, AAD = the header.
    ///
    /// # Panics
    /// If `packet.len() < 9 + plain_len + 16` (a caller bug: buffers are sized for a
    /// full datagram).
    pub fn seal(&self, packet: &mut [u8], plain_len: usize, pn: u64) -> usize {
        let total = SEALED_HEADER_LEN + plain_len + TAG_LEN;
        assert!(
            packet.len() >= total,
            "seal: buffer of {} bytes cannot hold {} plaintext bytes",
            packet.len(),
            plain_len
        );
        let (header, body) = packet.split_at_mut(SEALED_HEADER_LEN);
        let (plain, tag_out) = body.split_at_mut(plain_len);
        let tag = self
            .0
            .seal_in_place_separate_tag(nonce(pn), Aad::from(&*header), plain)
            .expect("AES-GCM seal only fails for oversized inputs");
        tag_out[..TAG_LEN].copy_from_slice(tag.as_ref());
        total
    }

    /// Seals the whole datagram `d`, written as [`seal`](Self::seal) expects with room for
    /// the tag at its end (a datagram `Connection::poll_transmit_deferred` left unsealed).
    ///
    /// # Panics
    /// If `d` is shorter than a header and a tag.
    pub fn seal_datagram(&self, d: &mut [u8], pn: u64) -> usize {
        let plain_len = d
            .len()
            .checked_sub(SEALED_HEADER_LEN + TAG_LEN)
            .expect("seal_datagram: shorter than a sealed packet");
        self.seal(d, plain_len, pn)
    }

    /// Opens a whole sealed datagram in place and returns its plaintext; `pn` is the full
    /// packet number ([`crate::wire::decode_pn`] of the header's). Any failure (short, forged,
    /// corrupt, wrong key, wrong pn) is `Err`; the buffer's contents are then unspecified.
    pub fn open<'a>(&self, packet: &'a mut [u8], pn: u64) -> Result<&'a mut [u8], CryptoError> {
        if packet.len() < SEALED_HEADER_LEN + TAG_LEN {
            return Err(CryptoError::TooShort);
        }
        let (header, body) = packet.split_at_mut(SEALED_HEADER_LEN);
        let header: &[u8] = header;
        self.0
            .open_in_place(nonce(pn), Aad::from(header), body)
            .map_err(|_| CryptoError::Auth)
    }
}

impl PacketKey {
    /// [`open`](Self::open), for a driver that opens on another thread than the core's:
    /// the plaintext is left in `d` after the header, and the result says how long it is.
    pub fn open_datagram(&self, d: &mut [u8], pn: u64) -> Result<Opened, CryptoError> {
        let plain_len = self.open(d, pn)?.len();
        Ok(Opened { pn, plain_len })
    }
}

/// Keys of one session, named from the owner's point of view.
#[derive(Debug)]
pub struct SessionKeys {
    /// Seals what this side sends (shared with a driver that seals off the protocol's
    /// thread, see `Connection::poll_transmit_deferred`).
    pub send: Arc<PacketKey>,
    /// Opens what the peer sends (shared as `send` is).
    pub recv: Arc<PacketKey>,
}

/// Packet numbers the window remembers: a pn this far or further below the highest is old.
pub const REPLAY_WINDOW: u64 = 65536;
// One extra word so that every pn within REPLAY_WINDOW of the highest has its own bit
// (the window need not start on a word boundary).
const WORDS: usize = (REPLAY_WINDOW / 64) as usize + 1;

/// Sliding bitmap of the last 65 536 packet numbers: `is_fresh` rejects duplicates and
/// anything `REPLAY_WINDOW` or more below the highest seen. A ring of u64 words indexed by
/// `pn / 64`; moving forward clears only the words entered, so `mark` is O(1) amortised.
#[derive(Clone)]
pub struct ReplayWindow {
    words: Box<[u64; WORDS]>,
    highest: Option<u64>,
}

impl fmt::Debug for ReplayWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplayWindow")
            .field("highest", &self.highest)
            .finish_non_exhaustive()
    }
}

impl Default for ReplayWindow {
    fn default() -> Self {
        Self::new()
    }
}

impl ReplayWindow {
    /// An empty window: every packet number is fresh.
    pub fn new() -> Self {
        ReplayWindow {
            words: Box::new([0; WORDS]),
            highest: None,
        }
    }

    fn slot(pn: u64) -> (usize, u64) {
        (((pn / 64) % WORDS as u64) as usize, 1u64 << (pn % 64))
    }

    /// True if `pn` has not been marked and is not too old to tell.
    pub fn is_fresh(&self, pn: u64) -> bool {
        match self.highest {
            None => true,
            Some(h) if pn > h => true,
            Some(h) if h - pn >= REPLAY_WINDOW => false,
            Some(_) => {
                let (w, bit) = Self::slot(pn);
                self.words[w] & bit == 0
            }
        }
    }

    /// Records `pn` as seen. Call only after the packet authenticated, or a forger could
    /// push the window forward. A pn too old for the window is ignored.
    pub fn mark(&mut self, pn: u64) {
        match self.highest {
            Some(h) if pn <= h => {
                if h - pn >= REPLAY_WINDOW {
                    return;
                }
            }
            _ => {
                // Words newly entered by the advance still hold bits of pns a full ring
                // older: clear them (all of them if the jump laps the ring).
                if let Some(h) = self.highest {
                    let (from, to) = (h / 64 + 1, pn / 64);
                    if to >= from {
                        if to - from >= WORDS as u64 - 1 {
                            self.words.fill(0);
                        } else {
                            for word in from..=to {
                                self.words[(word % WORDS as u64) as usize] = 0;
                            }
                        }
                    }
                }
                self.highest = Some(pn);
            }
        }
        let (w, bit) = Self::slot(pn);
        self.words[w] |= bit;
    }

    /// `is_fresh` then `mark`; returns whether it was fresh.
    pub fn check_and_mark(&mut self, pn: u64) -> bool {
        let fresh = self.is_fresh(pn);
        if fresh {
            self.mark(pn);
        }
        fresh
    }

    /// The highest packet number marked, if any.
    pub fn highest(&self) -> Option<u64> {
        self.highest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_clears_reused_words() {
        let mut w = ReplayWindow::new();
        for pn in 0..200 {
            w.mark(pn);
        }
        // Jump so that word slots of pns 0..200 are reused: those must read as fresh again
        // (relative to the new highest they are new pns), not as stale bits.
        let jump = WORDS as u64 * 64;
        w.mark(jump + 150);
        for pn in jump..jump + 150 {
            assert!(w.is_fresh(pn), "pn {pn}");
        }
        assert!(!w.is_fresh(jump + 150));
        assert!(!w.is_fresh(150));
    }

    #[test]
    fn window_edge_is_exact() {
        let mut w = ReplayWindow::new();
        let h = 1_000_000 + 37;
        w.mark(h);
        assert!(w.is_fresh(h - (REPLAY_WINDOW - 1)));
        assert!(!w.is_fresh(h - REPLAY_WINDOW));
        w.mark(h - (REPLAY_WINDOW - 1));
        assert!(!w.is_fresh(h - (REPLAY_WINDOW - 1)));
        // the oldest slot must not alias the newest
        assert!(!w.is_fresh(h));
        for pn in h - (REPLAY_WINDOW - 2)..h {
            assert!(w.is_fresh(pn));
        }
        // nor pns just above the highest, once the highest moves up within its word
        w.mark(h + 3);
        for pn in h + 1..h + 3 {
            assert!(w.is_fresh(pn), "pn {pn}");
        }
    }

    const HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    fn seq_key() -> Psk {
        Psk::from_bytes(std::array::from_fn(|i| i as u8))
    }

    #[test]
    fn key_file_round_trip() {
        let k = Psk::generate();
        let text = k.to_key_file_string();
        assert!(text.starts_with("# hayate pre-shared key; keep it secret\nhayate-key-v1 "));
        assert!(text.ends_with('\n'));
        assert_eq!(Psk::parse_key_file(&text).unwrap(), k);
        assert_eq!(
            seq_key().to_key_file_string(),
            format!("# hayate pre-shared key; keep it secret\nhayate-key-v1 {HEX}\n")
        );
        assert_ne!(Psk::generate(), Psk::generate());
    }

    #[test]
    fn key_file_tolerance_and_errors() {
        let ok = |t: &str| Psk::parse_key_file(t);
        assert_eq!(ok(&format!("hayate-key-v1 {HEX}")).unwrap(), seq_key());
        assert_eq!(
            ok(&format!(
                "\n  # c\n#x\r\n\t hayate-key-v1   {HEX}  \r\n\n# trailing\n"
            ))
            .unwrap(),
            seq_key()
        );
        assert_eq!(
            ok(&format!("hayate-key-v1 {}", HEX.to_uppercase())).unwrap(),
            seq_key()
        );
        assert_eq!(ok(""), Err(KeyFileError::Missing));
        assert_eq!(ok("# only a comment\n\n"), Err(KeyFileError::Missing));
        assert!(matches!(
            ok(&format!("hayate-key-v2 {HEX}")),
            Err(KeyFileError::BadFormat(_))
        ));
        assert!(matches!(ok(HEX), Err(KeyFileError::BadFormat(_))));
        assert!(matches!(
            ok("hayate-key-v1"),
            Err(KeyFileError::BadFormat(_))
        ));
        assert!(matches!(
            ok(&format!("hayate-key-v1 {HEX} x")),
            Err(KeyFileError::BadFormat(_))
        ));
        assert!(matches!(
            ok(&format!("hayate-key-v1 {HEX}\nhayate-key-v1 {HEX}")),
            Err(KeyFileError::BadFormat(_))
        ));
        assert_eq!(
            ok(&format!("hayate-key-v1 {}", &HEX[..62])),
            Err(KeyFileError::WrongLength(62))
        );
        assert_eq!(
            ok(&format!("hayate-key-v1 {HEX}00")),
            Err(KeyFileError::WrongLength(66))
        );
        assert_eq!(
            ok(&format!("hayate-key-v1 {}g", &HEX[..63])),
            Err(KeyFileError::BadHex)
        );
        assert_eq!(
            ok(&format!("hayate-key-v1 {}é", &HEX[..62])),
            Err(KeyFileError::BadHex)
        );
    }

    #[test]
    fn debug_does_not_leak_the_key() {
        let k = Psk::from_bytes([0xab; 32]);
        let s = format!("{k:?}");
        assert!(!s.to_lowercase().contains("ab"), "{s}");
        assert!(!format!("{:?}", PacketKey::new(&[0xab; 32])).contains("171"));
    }
}
