//! The heartbeat an instance agent sends the coordinator every interval (HashMVT §IV-C,
//! §IV-D1): load, active entries, free resources and the matching range. A versioned binary
//! format, so that a later issue can send it over UDP between processes:
//!
//! ```text
//! magic "FSHB" | version u8 (1) | instance u32 | seq u64 | sent_at u64 (ns)
//! | busy_cycles u64 | total_cycles u64 | active_entries u64 | free_resources u64
//! | range count u32 | count × (len u16, ceil(len/8) bytes)
//! ```
//!
//! All integers big-endian. Decoding checks every length and never panics.

use flowstate_mvt::{Key, Match, KEY_BITS};

const MAGIC: &[u8; 4] = b"FSHB";
/// The format version this code writes and reads.
pub const VERSION: u8 = 1;

/// One heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    /// The instance.
    pub instance: u32,
    /// Sequence number, one per heartbeat of the instance.
    pub seq: u64,
    /// When it was sent (the agent's clock, ns).
    pub sent_at: u64,
    /// Cycles (or ns) spent processing packets in the interval: C_pkt of Eq. 1.
    pub busy_cycles: u64,
    /// Cycles (or ns) of the interval: C_Total of Eq. 1.
    pub total_cycles: u64,
    /// Active (valid) entries of the instance's MVT ("memory usage", §IV-C).
    pub active_entries: u64,
    /// Free resources in the instance's pool.
    pub free_resources: u64,
    /// The matching range: the prefixes of the traffic the instance holds state for.
    pub range: Vec<Match>,
}

/// Why bytes are not a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Too short for what it says it holds.
    #[error("truncated heartbeat")]
    Truncated,
    /// Not a heartbeat.
    #[error("bad magic")]
    Magic,
    /// A version this code does not read.
    #[error("unsupported heartbeat version {0}")]
    Version(u8),
    /// A prefix longer than a key can be.
    #[error("bad prefix length {0}")]
    PrefixLength(u16),
    /// Bytes after the end.
    #[error("trailing bytes")]
    Trailing,
}

impl Heartbeat {
    /// η = C_pkt / C_Total (Eq. 1), 0 for an empty interval.
    pub fn load(&self) -> f64 {
        if self.total_cycles == 0 {
            0.0
        } else {
            (self.busy_cycles as f64 / self.total_cycles as f64).min(1.0)
        }
    }

    /// The encoded heartbeat.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(61 + self.range.len() * 6);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&self.instance.to_be_bytes());
        for v in [
            self.seq,
            self.sent_at,
            self.busy_cycles,
            self.total_cycles,
            self.active_entries,
            self.free_resources,
        ] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        out.extend_from_slice(&(self.range.len() as u32).to_be_bytes());
        for m in &self.range {
            out.extend_from_slice(&m.len().to_be_bytes());
            out.extend_from_slice(m.bytes());
        }
        out
    }

    /// Decodes `b`.
    pub fn decode(b: &[u8]) -> Result<Heartbeat, DecodeError> {
        let mut r = Reader(b);
        if r.take(4)? != MAGIC {
            return Err(DecodeError::Magic);
        }
        let v = r.take(1)?[0];
        if v != VERSION {
            return Err(DecodeError::Version(v));
        }
        let instance = r.u32()?;
        let mut hb = Heartbeat {
            instance,
            seq: r.u64()?,
            sent_at: r.u64()?,
            busy_cycles: r.u64()?,
            total_cycles: r.u64()?,
            active_entries: r.u64()?,
            free_resources: r.u64()?,
            range: Vec::new(),
        };
        let n = r.u32()? as usize;
        // Each prefix takes at least 2 bytes: a count larger than the rest is a lie.
        if n > r.0.len() / 2 {
            return Err(DecodeError::Truncated);
        }
        hb.range.reserve(n);
        for _ in 0..n {
            let len = u16::from_be_bytes([r.take(1)?[0], r.take(1)?[0]]);
            if len > KEY_BITS {
                return Err(DecodeError::PrefixLength(len));
            }
            let bytes = r.take(usize::from(len).div_ceil(8))?;
            hb.range.push(Match::prefix(&Key::from_bytes(bytes), len));
        }
        if !r.0.is_empty() {
            return Err(DecodeError::Trailing);
        }
        Ok(hb)
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn round_trips_and_rejects_garbage() {
        let hb = Heartbeat {
            instance: 3,
            seq: 9,
            sent_at: 1_000,
            busy_cycles: 30,
            total_cycles: 40,
            active_entries: 5,
            free_resources: 77,
            range: vec![
                Match::v4(Ipv4Addr::new(10, 1, 0, 0), 16),
                Match::ANY,
                Match::v4(Ipv4Addr::new(10, 2, 3, 4), 32),
            ],
        };
        let b = hb.encode();
        assert_eq!(Heartbeat::decode(&b), Ok(hb.clone()));
        assert!((hb.load() - 0.75).abs() < 1e-12);
        for cut in 0..b.len() {
            assert!(Heartbeat::decode(&b[..cut]).is_err());
        }
        let mut v2 = b.clone();
        v2[4] = 2;
        assert_eq!(Heartbeat::decode(&v2), Err(DecodeError::Version(2)));
        let mut long = b.clone();
        long.push(0);
        assert_eq!(Heartbeat::decode(&long), Err(DecodeError::Trailing));
        let mut x: u32 = 1;
        for _ in 0..2000 {
            let mut junk = b.clone();
            for _ in 0..3 {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                let i = (x >> 8) as usize % junk.len();
                junk[i] ^= (x >> 24) as u8 | 1;
            }
            let _ = Heartbeat::decode(&junk); // never panics
        }
    }
}
