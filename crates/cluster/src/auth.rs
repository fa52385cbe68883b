//! Authentication of every datagram between the cluster's roles: a trailer with the sender,
//! the key, a nonce and an AES-256-GCM tag (NIST SP 800-38D, through `ring::aead`): the
//! datagram is encrypted in place and the trailer's first 20 bytes are the associated data,
//! under a key shared by the cluster's hosts and read from a file (`[cluster] key_file`). So
//! what crosses the network between hosts (users' packets, state, assignments) is private
//! too, and none of it can be changed without the tag failing.
//!
//! ```text
//!  datagram as the role wrote it, encrypted | trailer (36 bytes)
//!  0       1       2               4
//! +-------+-------+---------------+
//! | role  | key   |   reserved    |   role: 1 root, 2 instance, 3 controller
//! +-------+-------+---------------+
//! |           sender id           |
//! +-------------------------------+
//! |         nonce prefix          |   random, drawn per sealer
//! +-------------------------------+
//! |     sequence number (u64)     |   nonce (96 bits): prefix, then sequence number
//! |                               |
//! +-------------------------------+
//! |        AES-256-GCM tag        |   over the encrypted datagram; associated data:
//! |          (16 bytes)           |   the 20 bytes above
//! +-------------------------------+
//! ```
//!
//! Why AES-GCM over the datagram as its plaintext: `ring` 0.17 encrypts and hashes a GCM
//! plaintext in one stitched AES-NI and carry-less-multiply pass, but hashes associated data
//! one 16-byte block at a time, and hashes ChaCha20-Poly1305's either way with scalar
//! Poly1305. One 1514-byte datagram sealed: 0.35 µs (AES-256-GCM, encrypting), 0.85 µs
//! (ChaCha20-Poly1305 or AES-256-GCM with the datagram as associated data); 64 bytes: 0.13
//! and 0.19 µs (AMD EPYC with AES-NI, VAES and VPCLMULQDQ). The root seals and opens every packet
//! once each way: the saving is about a microsecond of its time per packet. A repeated nonce
//! would reveal GCM's hash key and the two plaintexts' XOR: hence the nonce's construction.
//!
//! The nonce (96 bits) is the trailer's nonce prefix followed by its sequence number, and must
//! never repeat under one key:
//! * The prefix is 32 bits drawn from the system's random source for each [`Sealer`] (each
//!   role's process start; clones share it). The sequence number alone would repeat: a cut-off
//!   instance and its replacement sign with the same sender id, and a clock stepped back
//!   starts a new process on numbers an earlier one used.
//! * The sequence number starts at the wall clock's nanoseconds when the sealer is made and
//!   goes one up per datagram from an atomic counter, never from the clock again: it strictly
//!   increases per sealer whatever the clock does. A sealer that would wrap past 2^64 − 1
//!   signs nothing more ([`Sealer::seal`] returns `None`).
//! * So two datagrams share a nonce only if two sealers under the same key drew the same
//!   prefix (2^-32 per pair) and their ranges of sequence numbers overlap. Every sender's id
//!   and role, the key id, the nonce and the datagram are in the associated data, so none can
//!   be changed without the tag failing.
//!
//! Keys: the key file's 32-byte secrets are not used as they are: each becomes the
//! AES-256-GCM key HKDF-SHA-256 (RFC 5869) expands from it with this trailer's label
//! ([`KEY_INFO`]), so that one secret never keys two algorithms (another use of the file derives
//! its own key by its own label), at the cost of one derivation per key file read.
//!
//! Promises:
//! * A datagram is taken only if its tag verifies under one of the keys of the file (the first
//!   signs, every one is accepted: a key rotation adds the new key everywhere, then makes it
//!   first, then removes the old one, with no datagram refused on the way) and its sequence
//!   number was not taken before from that sender: a sliding window of [`WINDOW`] numbers per
//!   sender (RFC 4303 §3.4.3's anti-replay window), moved only by datagrams that verified.
//! * A sender numbers its datagrams from the wall clock's nanoseconds at its start, one up per
//!   datagram, so a restarted sender continues above its earlier numbers without keeping any
//!   state. A number more than the allowed clock skew ahead of the receiver's clock is refused,
//!   not adopted (it would make every later real one look replayed).
//! * Every refusal is counted by reason ([`Rejected`]); nothing in a datagram can make the
//!   receiver allocate beyond [`MAX_SENDERS`] windows, and parsing never panics.
//! * `[cluster] unauthenticated = true` (a lab measuring the cost) writes the same trailer with
//!   a zero tag, encrypts nothing and checks the sequence only.

use arc_swap::ArcSwap;
use ring::{aead, hkdf};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Bytes the trailer adds to a datagram.
pub const TRAILER_LEN: usize = HEADER_LEN + TAG_LEN;
/// Bytes of the trailer before the tag (role, key id, reserved, sender id, nonce prefix,
/// sequence number).
const HEADER_LEN: usize = 20;
/// Bytes of the tag.
const TAG_LEN: usize = aead::MAX_TAG_LEN;
/// Bytes of a key file's secret.
pub const KEY_LEN: usize = 32;
/// HKDF's `info` for the trailer's key (see the module documentation).
pub const KEY_INFO: &[u8] = b"flowstate cluster trailer v3 aes-256-gcm";
/// The algorithm that encrypts and tags.
static ALGORITHM: &aead::Algorithm = &aead::AES_256_GCM;
/// Keys a file may hold (the one that signs and those accepted during a rotation).
pub const MAX_KEYS: usize = 4;
/// Sequence numbers a receiver remembers per sender, below the highest it took.
pub const WINDOW: u64 = 256;
/// Senders a receiver keeps a window for.
pub const MAX_SENDERS: usize = 65_536;

/// A role of the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum Role {
    /// The root.
    Root = 1,
    /// An NF instance.
    Instance = 2,
    /// The controller.
    Controller = 3,
}

/// Who sent a datagram, as its verified trailer says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sender {
    /// Its role.
    pub role: Role,
    /// Its id in the role (an instance's id, a root's or a controller's index).
    pub id: u32,
}

impl Sender {
    /// Root `index` (its place in `[cluster] address`).
    pub fn root(index: u32) -> Sender {
        Sender {
            role: Role::Root,
            id: index,
        }
    }

    /// Controller `index` (its place in `[cluster] controller`).
    pub fn controller(index: u32) -> Sender {
        Sender {
            role: Role::Controller,
            id: index,
        }
    }

    /// Instance `id`.
    pub fn instance(id: u32) -> Sender {
        Sender {
            role: Role::Instance,
            id,
        }
    }
}

/// Why a datagram was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[repr(usize)]
pub enum Rejected {
    /// Shorter than a trailer, or a role that does not exist.
    #[error("malformed trailer")]
    Malformed = 0,
    /// Signed with a key the file does not hold.
    #[error("unknown key")]
    UnknownKey = 1,
    /// The tag does not verify.
    #[error("bad tag")]
    BadTag = 2,
    /// A sequence number taken before from this sender.
    #[error("replayed")]
    Replayed = 3,
    /// A sequence number below the sender's window.
    #[error("too old")]
    TooOld = 4,
    /// A sequence number beyond the allowed clock skew.
    #[error("sequence ahead of the clock")]
    Ahead = 5,
    /// Windows for [`MAX_SENDERS`] senders are kept already.
    #[error("too many senders")]
    TooManySenders = 6,
    /// Verified, but from a role or member that may not send it (counted by the role).
    #[error("wrong sender")]
    WrongSender = 7,
}

impl Rejected {
    const ALL: [Rejected; 8] = [
        Rejected::Malformed,
        Rejected::UnknownKey,
        Rejected::BadTag,
        Rejected::Replayed,
        Rejected::TooOld,
        Rejected::Ahead,
        Rejected::TooManySenders,
        Rejected::WrongSender,
    ];

    /// The reason's name in counters.
    pub fn name(self) -> &'static str {
        match self {
            Rejected::Malformed => "malformed",
            Rejected::UnknownKey => "unknown_key",
            Rejected::BadTag => "bad_tag",
            Rejected::Replayed => "replayed",
            Rejected::TooOld => "too_old",
            Rejected::Ahead => "ahead",
            Rejected::TooManySenders => "too_many_senders",
            Rejected::WrongSender => "wrong_sender",
        }
    }
}

/// Datagrams refused, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RejectCounts([u64; 8]);

impl RejectCounts {
    /// Counts one refusal.
    pub fn add(&mut self, why: Rejected) {
        self.0[why as usize] += 1;
    }

    /// Refusals for `why`.
    pub fn get(&self, why: Rejected) -> u64 {
        self.0[why as usize]
    }

    /// Reasons with a count, by name (for stats files).
    pub fn by_name(&self) -> std::collections::BTreeMap<&'static str, u64> {
        Rejected::ALL
            .iter()
            .filter(|r| self.get(**r) > 0)
            .map(|r| (r.name(), self.get(*r)))
            .collect()
    }
}

/// Why a key file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// It cannot be read.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// Others than its owner may read it.
    #[error("{path}: readable by others than its owner (mode {mode:o}): run chmod 600 {path}")]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its mode.
        mode: u32,
    },
    /// Its text is not a key list.
    #[error("{path}: line {line}: {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// The 1-based line.
        line: usize,
        /// What is wrong.
        reason: String,
    },
}

/// The keys of a key file: the first signs, every one is accepted.
pub struct Keys {
    keys: Vec<(u8, aead::LessSafeKey)>,
    /// No key: the trailer carries a zero tag, not checked.
    unauthenticated: bool,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key material.
        f.debug_struct("Keys")
            .field("ids", &self.ids())
            .field("unauthenticated", &self.unauthenticated)
            .finish()
    }
}

impl Keys {
    /// The keys of a key file's text: one per line, `ID HEX` (an id from 0 to 255 and 64
    /// hexadecimal digits, 32 bytes), the first the one that signs; `#` starts a comment.
    /// Errors are `(line, reason)`.
    pub fn parse(text: &str) -> Result<Keys, (usize, String)> {
        let mut keys: Vec<(u8, aead::LessSafeKey)> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let fail = |r: String| (n + 1, r);
            let mut words = line.split_whitespace();
            let (Some(id), Some(hex), None) = (words.next(), words.next(), words.next()) else {
                return Err(fail(
                    "expected `ID KEY` (an id from 0 to 255 and 64 hexadecimal digits)".into(),
                ));
            };
            let id: u8 = id
                .parse()
                .map_err(|_| fail(format!("key id {id:?} is not a number from 0 to 255")))?;
            let bytes = decode_hex(hex).ok_or_else(|| {
                fail(format!(
                    "key {id}: expected {} hexadecimal digits ({KEY_LEN} bytes)",
                    2 * KEY_LEN
                ))
            })?;
            if keys.iter().any(|(k, _)| *k == id) {
                return Err(fail(format!("key id {id} appears twice")));
            }
            if keys.len() == MAX_KEYS {
                return Err(fail(format!("more than {MAX_KEYS} keys")));
            }
            keys.push((id, derive_key(&bytes)));
        }
        if keys.is_empty() {
            return Err((0, "no key".into()));
        }
        Ok(Keys {
            keys,
            unauthenticated: false,
        })
    }

    /// Reads a key file; refuses one that others than its owner may read.
    pub fn read(path: &Path) -> Result<Keys, KeyError> {
        use std::os::unix::fs::PermissionsExt;
        let io = |error| KeyError::Io {
            path: path.to_path_buf(),
            error,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Permissions {
                path: path.to_path_buf(),
                mode,
            });
        }
        let text = flowstate_config::read_text(path).map_err(io)?;
        Keys::parse(&text).map_err(|(line, reason)| KeyError::Format {
            path: path.to_path_buf(),
            line,
            reason,
        })
    }

    /// No key: trailers carry a zero tag that nobody checks (`[cluster] unauthenticated`).
    pub fn unauthenticated() -> Keys {
        Keys {
            keys: Vec::new(),
            unauthenticated: true,
        }
    }

    /// The ids of the keys, the signing one first.
    pub fn ids(&self) -> Vec<u8> {
        self.keys.iter().map(|(id, _)| *id).collect()
    }

    fn key(&self, id: u8) -> Option<&aead::LessSafeKey> {
        self.keys.iter().find(|(k, _)| *k == id).map(|(_, k)| k)
    }
}

/// The trailer's key from a key file's secret: HKDF-SHA-256 with no salt and [`KEY_INFO`].
fn derive_key(secret: &[u8; KEY_LEN]) -> aead::LessSafeKey {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &[]).extract(secret);
    // 32 bytes from SHA-256's HKDF are well under its limit of 255 * 32: this cannot fail.
    let okm = prk
        .expand(&[KEY_INFO], ALGORITHM)
        .expect("HKDF-SHA-256 yields a 32-byte key");
    aead::LessSafeKey::new(aead::UnboundKey::from(okm))
}

/// A new key file's line: `ID HEX` of 32 bytes from the system's random source.
pub fn generate_line(id: u8) -> Result<String, KeyError> {
    Ok(format!("{id} {}", random_secret()?))
}

/// 32 bytes from the system's random source, in hexadecimal (a key, a token, a password).
pub fn random_secret() -> Result<String, KeyError> {
    use ring::rand::SecureRandom;
    let mut key = [0u8; KEY_LEN];
    ring::rand::SystemRandom::new()
        .fill(&mut key)
        .map_err(|_| KeyError::Io {
            path: PathBuf::from("(system random source)"),
            error: std::io::Error::other("no random bytes"),
        })?;
    Ok(key.iter().map(|b| format!("{b:02x}")).collect())
}

fn decode_hex(s: &str) -> Option<[u8; KEY_LEN]> {
    let s = s.as_bytes();
    if s.len() != 2 * KEY_LEN {
        return None;
    }
    let nibble = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; KEY_LEN];
    for (o, pair) in out.iter_mut().zip(s.chunks_exact(2)) {
        *o = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

/// The keys a role uses, shared by its threads, read again when the file changes
/// ([`KeyRing::reload_if_changed`]): how a rotation reaches a running role.
#[derive(Debug, Clone)]
pub struct KeyRing {
    inner: Arc<RingInner>,
}

#[derive(Debug)]
struct RingInner {
    path: Option<PathBuf>,
    keys: ArcSwap<Keys>,
    /// The file's modification time and size when last read.
    stamp: Mutex<Option<(std::time::SystemTime, u64)>>,
}

fn stamp(path: &Path) -> Option<(std::time::SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

impl KeyRing {
    /// The keys of the file at `path`.
    pub fn open(path: &Path) -> Result<KeyRing, KeyError> {
        let stamp_then = stamp(path);
        let keys = Keys::read(path)?;
        Ok(KeyRing {
            inner: Arc::new(RingInner {
                path: Some(path.to_path_buf()),
                keys: ArcSwap::from_pointee(keys),
                stamp: Mutex::new(stamp_then),
            }),
        })
    }

    /// Fixed keys, never read again (tests).
    pub fn fixed(keys: Keys) -> KeyRing {
        KeyRing {
            inner: Arc::new(RingInner {
                path: None,
                keys: ArcSwap::from_pointee(keys),
                stamp: Mutex::new(None),
            }),
        }
    }

    /// Whether datagrams are checked (not `[cluster] unauthenticated`).
    pub fn authenticated(&self) -> bool {
        !self.inner.keys.load().unauthenticated
    }

    /// Reads the file again if it changed since it was last read. A file that no longer
    /// reads as keys leaves the keys as they were (logged once per change).
    pub fn reload_if_changed(&self) {
        let Some(path) = &self.inner.path else {
            return;
        };
        let now = stamp(path);
        let Ok(mut last) = self.inner.stamp.lock() else {
            return;
        };
        if now.is_none() || now == *last {
            return;
        }
        *last = now;
        match Keys::read(path) {
            Ok(keys) => {
                tracing::info!(path = %path.display(), ids = ?keys.ids(), "key file read again");
                self.inner.keys.store(Arc::new(keys));
            }
            Err(e) => {
                tracing::error!("key file changed but cannot be used, keeping the keys in use: {e}")
            }
        }
    }

    /// The ids of the keys in use, the signing one first.
    pub fn ids(&self) -> Vec<u8> {
        self.inner.keys.load().ids()
    }

    /// A sealer that signs as `from`, numbering from `now_ns` (the wall clock) with a nonce
    /// prefix of its own from the system's random source (which can fail only if there is
    /// none). Clones share the prefix and the sequence numbers.
    pub fn sealer(&self, from: Sender, now_ns: u64) -> std::io::Result<Sealer> {
        use ring::rand::SecureRandom;
        let mut prefix = [0u8; 4];
        ring::rand::SystemRandom::new()
            .fill(&mut prefix)
            .map_err(|_| std::io::Error::other("no random bytes for the trailer's nonce"))?;
        Ok(Sealer {
            ring: self.clone(),
            from,
            prefix,
            first: now_ns,
            seq: Arc::new(AtomicU64::new(now_ns)),
        })
    }

    /// An opener that allows sequence numbers up to `skew_ns` ahead of its clock.
    pub fn opener(&self, skew_ns: u64) -> Opener {
        Opener {
            ring: self.clone(),
            windows: HashMap::new(),
            skew_ns,
            rejected: RejectCounts::default(),
            accepted: 0,
        }
    }
}

/// Appends trailers: see the module documentation.
#[derive(Debug, Clone)]
pub struct Sealer {
    ring: KeyRing,
    from: Sender,
    /// The nonce's first 32 bits.
    prefix: [u8; 4],
    /// The first sequence number: one below it was handed out only after the counter
    /// wrapped, and is never used.
    first: u64,
    /// The next sequence number.
    seq: Arc<AtomicU64>,
}

impl Sealer {
    /// Appends the trailer to the `len` bytes at the start of `buf`; the datagram's new
    /// length, or `None` when `buf` has no room for it (or, never in practice, when the
    /// sealer's sequence numbers are used up).
    #[inline]
    pub fn seal(&self, buf: &mut [u8], len: usize) -> Option<usize> {
        let end = len.checked_add(TRAILER_LEN)?;
        let out = buf.get_mut(..end)?;
        let keys = self.ring.inner.keys.load();
        let key_id = keys.keys.first().map_or(0, |(id, _)| *id);
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        if seq < self.first {
            // The counter wrapped: its numbers, and so the nonces, would repeat.
            return None;
        }
        let h = &mut out[len..len + HEADER_LEN];
        h[0] = self.from.role as u8;
        h[1] = key_id;
        h[2..4].fill(0);
        h[4..8].copy_from_slice(&self.from.id.to_be_bytes());
        h[8..12].copy_from_slice(&self.prefix);
        h[12..20].copy_from_slice(&seq.to_be_bytes());
        let (body, trailer) = out.split_at_mut(len);
        let (h, tag) = trailer.split_at_mut(HEADER_LEN);
        match keys.keys.first() {
            Some((_, key)) => {
                let t = key
                    .seal_in_place_separate_tag(nonce(self.prefix, seq), aead::Aad::from(&*h), body)
                    .ok()?;
                tag.copy_from_slice(t.as_ref());
            }
            None => tag.fill(0),
        }
        Some(end)
    }

    /// `body` with its trailer appended (a message built on its own: a report, an
    /// assignment).
    pub fn sealed(&self, mut body: Vec<u8>) -> Vec<u8> {
        let len = body.len();
        body.resize(len + TRAILER_LEN, 0);
        // Room for the trailer was just made: this cannot fail.
        let _ = self.seal(&mut body, len);
        body
    }
}

/// The 96-bit nonce: the sealer's prefix, then the sequence number.
#[inline]
fn nonce(prefix: [u8; 4], seq: u64) -> aead::Nonce {
    let mut n = [0u8; aead::NONCE_LEN];
    n[..4].copy_from_slice(&prefix);
    n[4..].copy_from_slice(&seq.to_be_bytes());
    aead::Nonce::assume_unique_for_key(n)
}

/// One sender's anti-replay window: the highest number taken and which of the [`WINDOW`]
/// below it were taken.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    top: u64,
    /// Bit `i` of word `i / 64`: `top - i` was taken.
    seen: [u64; (WINDOW / 64) as usize],
}

impl Window {
    /// Whether `seq` may be taken: not below the window, not taken before.
    fn check(&self, seq: u64) -> Result<(), Rejected> {
        if seq > self.top {
            return Ok(());
        }
        let d = self.top - seq;
        if d >= WINDOW {
            return Err(Rejected::TooOld);
        }
        if self.seen[(d / 64) as usize] >> (d % 64) & 1 == 1 {
            return Err(Rejected::Replayed);
        }
        Ok(())
    }

    /// Takes `seq` (checked).
    fn take(&mut self, seq: u64) {
        if seq > self.top {
            let shift = seq - self.top;
            if shift >= WINDOW {
                self.seen = [0; (WINDOW / 64) as usize];
            } else {
                let (words, bits) = ((shift / 64) as usize, (shift % 64) as u32);
                let n = self.seen.len();
                for i in (0..n).rev() {
                    let lo = i.checked_sub(words).map_or(0, |j| self.seen[j]);
                    let carry = match i.checked_sub(words + 1) {
                        Some(j) if bits > 0 => self.seen[j] >> (64 - bits),
                        _ => 0,
                    };
                    self.seen[i] = lo << bits | carry;
                }
            }
            self.top = seq;
        }
        let d = self.top - seq;
        self.seen[(d / 64) as usize] |= 1 << (d % 64);
    }
}

/// Checks trailers: see the module documentation.
#[derive(Debug)]
pub struct Opener {
    ring: KeyRing,
    windows: HashMap<Sender, Window>,
    skew_ns: u64,
    rejected: RejectCounts,
    accepted: u64,
}

impl Opener {
    /// The sender and the datagram without its trailer, decrypted in place, if it verifies
    /// and was not taken before; `now_ns` is the wall clock. Every refusal is counted; a
    /// refused datagram's bytes are left unspecified.
    #[inline]
    pub fn open<'a>(
        &mut self,
        datagram: &'a mut [u8],
        now_ns: u64,
    ) -> Result<(Sender, &'a [u8]), Rejected> {
        let r = self.check(datagram, now_ns);
        match r {
            Ok(_) => self.accepted += 1,
            Err(why) => self.rejected.add(why),
        }
        r
    }

    fn check<'a>(
        &mut self,
        datagram: &'a mut [u8],
        now_ns: u64,
    ) -> Result<(Sender, &'a [u8]), Rejected> {
        let len = datagram
            .len()
            .checked_sub(TRAILER_LEN)
            .ok_or(Rejected::Malformed)?;
        let (body, trailer) = datagram.split_at_mut(len);
        let (h, tag) = trailer.split_at(HEADER_LEN);
        let role = match h[0] {
            1 => Role::Root,
            2 => Role::Instance,
            3 => Role::Controller,
            _ => return Err(Rejected::Malformed),
        };
        let from = Sender {
            role,
            id: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
        };
        let prefix = [h[8], h[9], h[10], h[11]];
        let mut s = [0u8; 8];
        s.copy_from_slice(&h[12..20]);
        let seq = u64::from_be_bytes(s);
        let keys = self.ring.inner.keys.load();
        let key = if keys.unauthenticated {
            None
        } else {
            Some(keys.key(h[1]).ok_or(Rejected::UnknownKey)?)
        };
        if seq > now_ns.saturating_add(self.skew_ns) {
            return Err(Rejected::Ahead);
        }
        // The window is only looked at before the tag (a datagram taken before is not
        // decrypted twice), and moved only after it verified.
        let full = self.windows.len() >= MAX_SENDERS;
        let window = self.windows.get_mut(&from);
        match &window {
            Some(w) => w.check(seq)?,
            None if full => return Err(Rejected::TooManySenders),
            None => {}
        }
        if let Some(key) = key {
            let tag = aead::Tag::try_from(tag).map_err(|_| Rejected::Malformed)?;
            key.open_in_place_separate_tag(nonce(prefix, seq), aead::Aad::from(h), tag, body, 0..)
                .map_err(|_| Rejected::BadTag)?;
        }
        match window {
            Some(w) => w.take(seq),
            None => {
                let mut w = Window::default();
                w.take(seq);
                self.windows.insert(from, w);
            }
        }
        Ok((from, body))
    }

    /// Counts a verified datagram its role refuses (a role or member that may not send it).
    pub fn refuse(&mut self) {
        self.accepted = self.accepted.saturating_sub(1);
        self.rejected.add(Rejected::WrongSender);
    }

    /// Refusals so far, by reason.
    pub fn rejected(&self) -> RejectCounts {
        self.rejected
    }

    /// Datagrams taken so far.
    pub fn accepted(&self) -> u64 {
        self.accepted
    }

    /// The ids of the keys in use, the signing one first.
    pub fn keys(&self) -> Vec<u8> {
        self.ring.ids()
    }
}

#[cfg(test)]
mod tests;
