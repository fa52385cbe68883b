//! A batch of caller-owned, reusable packet buffers.

/// Per-packet metadata carried beside the bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PacketMeta {
    /// Capture or arrival time, nanoseconds since the Unix epoch (or since the start of a
    /// synthetic trace).
    pub timestamp_ns: u64,
    /// Length of the packet on the wire; larger than the stored length when the capture
    /// truncated it.
    pub wire_len: u32,
    /// Port the packet arrived on (0 for files and generators).
    pub port: u16,
    /// A slot the runtime may use (e.g. a logical clock, a worker index).
    pub user: u64,
}

/// A fixed number of packet buffers, each `buf_size` bytes, allocated once and reused.
///
/// Packets are appended with [`push`](Self::push) or [`push_with`](Self::push_with) until the
/// batch is full, read with [`get`](Self::get)/[`iter`](Self::iter), edited in place with
/// [`get_mut`](Self::get_mut), and dropped with [`clear`](Self::clear), which keeps the buffers.
#[derive(Debug, Clone)]
pub struct PacketBatch {
    bufs: Vec<Box<[u8]>>,
    lens: Vec<usize>,
    meta: Vec<PacketMeta>,
    len: usize,
    /// How many of the buffers pushes may fill (see [`PacketBatch::set_capacity`]).
    limit: usize,
}

/// Default number of packets in a batch (DESIGN: work in batches of 32).
pub const DEFAULT_BATCH: usize = 32;
/// Default buffer size: a full Ethernet frame with two VLAN tags, rounded up.
pub const DEFAULT_BUF_SIZE: usize = 2048;

impl Default for PacketBatch {
    fn default() -> Self {
        PacketBatch::new(DEFAULT_BATCH, DEFAULT_BUF_SIZE)
    }
}

impl PacketBatch {
    /// A batch of `capacity` buffers of `buf_size` bytes each (both at least 1).
    pub fn new(capacity: usize, buf_size: usize) -> Self {
        let capacity = capacity.max(1);
        let buf_size = buf_size.max(1);
        PacketBatch {
            bufs: (0..capacity)
                .map(|_| vec![0u8; buf_size].into_boxed_slice())
                .collect(),
            lens: vec![0; capacity],
            meta: vec![PacketMeta::default(); capacity],
            len: 0,
            limit: capacity,
        }
    }

    /// Number of packets in the batch.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the batch holds no packet.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether no more packet fits.
    #[inline]
    pub fn is_full(&self) -> bool {
        self.len >= self.limit
    }

    /// Maximum number of packets: the buffers allocated, unless
    /// [`set_capacity`](Self::set_capacity) lowered it.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.limit
    }

    /// Lets pushes fill at most `n` buffers (at least 1, at most those allocated): a reader
    /// fills a batch to its capacity, and a batch allocated larger keeps room for packets its
    /// owner adds after the read.
    #[inline]
    pub fn set_capacity(&mut self, n: usize) {
        self.limit = n.clamp(1, self.bufs.len());
    }

    /// Buffers allocated: the largest capacity [`set_capacity`](Self::set_capacity) gives.
    #[inline]
    pub fn allocated(&self) -> usize {
        self.bufs.len()
    }

    /// Size of each buffer: the longest packet a batch stores (longer ones are truncated).
    #[inline]
    pub fn buf_size(&self) -> usize {
        self.bufs[0].len()
    }

    /// Drops all packets; the buffers are kept.
    #[inline]
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Keeps the first `len` packets (all of them when there are fewer), dropping the rest.
    #[inline]
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Appends a copy of `data` (truncated to [`buf_size`](Self::buf_size)) with `meta`.
    /// Returns `false`, storing nothing, when the batch is full.
    #[inline]
    pub fn push(&mut self, data: &[u8], meta: PacketMeta) -> bool {
        self.push_with(|buf, m| {
            let n = data.len().min(buf.len());
            buf[..n].copy_from_slice(&data[..n]);
            *m = meta;
            n
        })
    }

    /// Appends a packet written in place: `fill` gets the next buffer (of
    /// [`buf_size`](Self::buf_size) bytes, holding stale bytes) and its metadata (reset to
    /// default) and returns the packet's length (clamped to the buffer). Returns `false`
    /// without calling `fill` when the batch is full.
    #[inline]
    pub fn push_with(&mut self, fill: impl FnOnce(&mut [u8], &mut PacketMeta) -> usize) -> bool {
        if self.is_full() {
            return false;
        }
        let i = self.len;
        let meta = &mut self.meta[i];
        *meta = PacketMeta::default();
        let buf = &mut self.bufs[i];
        let n = fill(buf, meta).min(buf.len());
        self.lens[i] = n;
        self.len += 1;
        true
    }

    /// Packet `i` and its metadata.
    #[inline]
    pub fn get(&self, i: usize) -> Option<(&[u8], &PacketMeta)> {
        (i < self.len).then(|| (&self.bufs[i][..self.lens[i]], &self.meta[i]))
    }

    /// Packet `i` and its metadata, mutable (length changes with [`set_len`](Self::set_len)).
    #[inline]
    pub fn get_mut(&mut self, i: usize) -> Option<(&mut [u8], &mut PacketMeta)> {
        if i < self.len {
            Some((&mut self.bufs[i][..self.lens[i]], &mut self.meta[i]))
        } else {
            None
        }
    }

    /// Sets packet `i`'s length (clamped to the buffer size); bytes past the old length are
    /// whatever the buffer held. Does nothing when `i` is out of range.
    #[inline]
    pub fn set_len(&mut self, i: usize, len: usize) {
        if i < self.len {
            self.lens[i] = len.min(self.bufs[i].len());
        }
    }

    /// The packets in order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &PacketMeta)> + '_ {
        self.bufs[..self.len]
            .iter()
            .zip(&self.lens[..self.len])
            .zip(&self.meta[..self.len])
            .map(|((b, &n), m)| (&b[..n], m))
    }

    /// The packets in order, mutable.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&mut [u8], &mut PacketMeta)> + '_ {
        self.bufs[..self.len]
            .iter_mut()
            .zip(&self.lens[..self.len])
            .zip(&mut self.meta[..self.len])
            .map(|((b, &n), m)| (&mut b[..n], m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lowered_capacity_keeps_room_for_later_pushes() {
        let mut b = PacketBatch::new(3, 4);
        b.set_capacity(1);
        assert_eq!((b.capacity(), b.allocated()), (1, 3));
        assert!(b.push(&[1], PacketMeta::default()));
        assert!(b.is_full() && !b.push(&[2], PacketMeta::default()));
        b.set_capacity(usize::MAX);
        assert_eq!(b.capacity(), 3);
        assert!(b.push(&[2], PacketMeta::default()) && b.push(&[3], PacketMeta::default()));
        assert!(b.is_full());
        assert_eq!(b.iter().map(|(p, _)| p[0]).collect::<Vec<_>>(), [1, 2, 3]);
        b.set_capacity(0);
        assert_eq!(b.capacity(), 1, "never below one");
        b.truncate(1);
        assert_eq!(b.iter().map(|(p, _)| p[0]).collect::<Vec<_>>(), [1]);
        b.truncate(5);
        assert_eq!(b.len(), 1);
    }

    #[test]
    fn fills_reuses_and_truncates() {
        let mut b = PacketBatch::new(2, 4);
        assert!(b.push(
            &[1, 2, 3],
            PacketMeta {
                timestamp_ns: 7,
                ..Default::default()
            }
        ));
        assert!(b.push(&[9, 9, 9, 9, 9, 9], PacketMeta::default()));
        assert!(b.is_full());
        assert!(!b.push(&[0], PacketMeta::default()));
        assert_eq!(
            b.get(0),
            Some((
                &[1u8, 2, 3][..],
                &PacketMeta {
                    timestamp_ns: 7,
                    ..Default::default()
                }
            ))
        );
        assert_eq!(b.get(1).unwrap().0, &[9, 9, 9, 9]);
        assert!(b.get(2).is_none());
        let ptr = b.get(0).unwrap().0.as_ptr();
        b.clear();
        assert!(b.is_empty());
        assert!(b.push_with(|buf, m| {
            buf[0] = 5;
            m.port = 3;
            1
        }));
        assert_eq!(b.get(0).unwrap().0, &[5]);
        assert_eq!(b.get(0).unwrap().0.as_ptr(), ptr, "buffers are reused");
        assert_eq!(b.iter().count(), 1);
        b.get_mut(0).unwrap().0[0] = 6;
        b.set_len(0, 100);
        assert_eq!(
            b.get(0).unwrap().0,
            &[6, 2, 3, 0],
            "stale bytes of buffer 0 past the old length"
        );
    }
}
