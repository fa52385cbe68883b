//! TCP window tracking as Linux conntrack does it (`tcp_in_window` in
//! `net/netfilter/nf_conntrack_proto_tcp.c`, after Guido van Rooij, "Real Stateful TCP Packet
//! Filtering in IP Filter", 2000). Per direction the firewall keeps the highest sequence number
//! sent (`end`), the highest the receiver allowed (`maxend`), the largest window seen (`maxwin`),
//! the highest ack sent (`maxack`) and the window scale; a segment is in window when
//!
//! * I.   `seq <= sender.maxend` (it starts inside what the receiver allowed),
//! * II.  `seq + len >= sender.end - receiver.maxwin` (it is not older than a window),
//! * III. `sack <= receiver.end` (it acknowledges only data that was seen),
//! * IV.  `sack >= receiver.end - max(sender.maxwin, 66000)` (not an overly old ack),
//!
//! `sack` being the highest SACK right edge, or the ack. Failing I or III marks the packet
//! invalid; failing II or IV (an old retransmission, an overly delayed ack) lets it pass
//! without updating anything (conntrack's `NFCT_TCP_IGNORE` in current kernels). Window scale
//! applies only when both SYNs carried the option (RFC 7323 §2.2); SYNs' windows are never
//! scaled. All comparisons are modulo 2^32 (RFC 9293 §3.4).
//!
//! Everything here is pure: the state is plain data in the connection's entry (see
//! [`Window::encode`]), the segment is the facts of a header ([`Seg`]).

use super::Segment;
use flowstate_state::CodecError;
use flowstate_wire::tcp;

/// `MAXACKWINCONST`: the least range below `receiver.end` an ack may fall in (IV).
pub const MAX_ACK_WINDOW: u32 = 66_000;

/// Conntrack's cap on the window scale shift (RFC 7323 §2.3).
pub const MAX_SCALE: u8 = 14;

/// [`Seen::flags`]: the side sent the window scale option in its SYN.
pub const WSCALE: u8 = 1;
/// [`Seen::flags`]: the side sent SACK-permitted in its SYN.
pub const SACK_PERM: u8 = 2;
/// [`Seen::flags`]: [`Seen::maxack`] holds an ack.
pub const MAXACK_SET: u8 = 4;

/// `a` is after `b` in sequence space (RFC 9293 §3.4).
#[inline]
pub fn after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// `a` is before `b` in sequence space.
#[inline]
pub fn before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// One direction of a connection as the firewall saw it (conntrack's `ip_ct_tcp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Seen {
    /// Highest `seq + len` sent.
    pub end: u32,
    /// Highest `ack + window` the other side allowed this side to send up to.
    pub maxend: u32,
    /// Largest (scaled) window this side advertised.
    pub maxwin: u32,
    /// Highest ack this side sent (valid with [`MAXACK_SET`]).
    pub maxack: u32,
    /// Window scale shift of this side's windows.
    pub scale: u8,
    /// [`WSCALE`], [`SACK_PERM`], [`MAXACK_SET`].
    pub flags: u8,
}

/// The packet last let through, as conntrack annotates it (`last_index`, `last_dir`, ...):
/// the RST checks and the resynchronisation after an ignored SYN read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Last {
    /// Its class, [`Segment::code`] (0: none yet).
    pub seg: u8,
    /// Its side: 0 the opener, 1 the other.
    pub dir: u8,
    /// Its `seq + len`.
    pub end: u32,
    /// Its ack.
    pub ack: u32,
    /// Its raw window.
    pub win: u16,
    /// Window scale of an ignored SYN.
    pub wscale: u8,
    /// [`WSCALE`] and [`SACK_PERM`] of an ignored SYN; [`CHALLENGE_ACK`].
    pub flags: u8,
}

/// [`Last::flags`]: a SYN ignored in LAST_ACK may be answered by a challenge ACK (RFC 5961 §4).
pub const CHALLENGE_ACK: u8 = 8;

/// [`Window::flags`]: both sides sent a SYN (conntrack's SYN_SENT2 path).
pub const SIMULTANEOUS: u8 = 1;
/// [`Window::flags`]: the other side has sent a packet (conntrack's `IPS_SEEN_REPLY`).
pub const SEEN_REPLY: u8 = 2;
/// [`Window::flags`]: the handshake completed with both sides seen (`IPS_ASSURED`).
pub const ASSURED: u8 = 4;

/// A TCP connection's window state: both directions, index 0 the opener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Window {
    /// Per side.
    pub seen: [Seen; 2],
    /// The last packet let through.
    pub last: Last,
    /// [`SIMULTANEOUS`], [`SEEN_REPLY`], [`ASSURED`].
    pub flags: u8,
}

/// The facts of a TCP segment window tracking reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Seg {
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgment number.
    pub ack: u32,
    /// Raw (unscaled) window.
    pub win: u16,
    /// Payload bytes.
    pub len: u32,
    /// SYN.
    pub syn: bool,
    /// ACK.
    pub ack_flag: bool,
    /// FIN.
    pub fin: bool,
    /// RST.
    pub rst: bool,
    /// The window scale option (SYNs).
    pub wscale: Option<u8>,
    /// SACK-permitted (SYNs).
    pub sack_perm: bool,
    /// The highest right edge of the first SACK option's blocks.
    pub sack: Option<u32>,
}

impl Seg {
    /// Reads a segment's header (the view is checked, so nothing here can fail). The options
    /// are read from SYNs, and from other segments only with `sack_blocks` (their SACK blocks
    /// matter to window checks only).
    pub fn read<T: AsRef<[u8]>>(p: &tcp::Packet<T>, sack_blocks: bool) -> Seg {
        let (mut wscale, mut sack_perm, mut sack) = (None, false, None);
        let options = if p.syn() || sack_blocks {
            p.options_bytes()
        } else {
            &[]
        };
        for o in tcp::Options::new(options) {
            match o {
                tcp::TcpOption::WindowScale(s) => wscale = Some(s),
                tcp::TcpOption::SackPermitted => sack_perm = true,
                tcp::TcpOption::Sack(blocks) if sack.is_none() => {
                    let mut top: Option<u32> = None;
                    for (_, right) in blocks.iter() {
                        if top.is_none_or(|t| after(right, t)) {
                            top = Some(right);
                        }
                    }
                    sack = top;
                }
                _ => {}
            }
        }
        Seg {
            seq: p.seq_number(),
            ack: p.ack_number(),
            win: p.window_len(),
            len: p.payload().len() as u32,
            syn: p.syn(),
            ack_flag: p.ack(),
            fin: p.fin(),
            rst: p.rst(),
            wscale,
            sack_perm,
            sack,
        }
    }

    /// `seq + len`, SYN and FIN counting one each.
    #[inline]
    pub fn end(&self) -> u32 {
        self.seq
            .wrapping_add(self.len)
            .wrapping_add(u32::from(self.syn))
            .wrapping_add(u32::from(self.fin))
    }

    /// The options of a SYN as a side's scale and flags.
    fn options(&self) -> (u8, u8) {
        let mut flags = 0;
        let mut scale = 0;
        if let Some(s) = self.wscale {
            scale = s.min(MAX_SCALE);
            flags |= WSCALE;
        }
        if self.sack_perm {
            flags |= SACK_PERM;
        }
        (scale, flags)
    }
}

/// Where the handshake is, for [`Window::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// SYN_SENT (or SYN_SENT2): a RST with sequence number 0 answers the SYN; a SYN with a
    /// higher sequence number re-initialises its side.
    SynSent,
    /// SYN_RECV: a SYN with a higher sequence number re-initialises its side.
    SynRecv,
    /// Any later state.
    Other,
}

/// Why a segment is out of window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// I: it starts past what the receiver allowed.
    SeqAboveWindow,
    /// III: it acknowledges data never sent.
    AckAboveData,
    /// II: it ends before the receiver's window (an old retransmission).
    SeqBelowWindow,
    /// IV: its ack is below the window (an overly delayed ack).
    AckBelowWindow,
}

/// The outcome of [`Window::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// In window; the state was updated.
    Accept,
    /// Passes, nothing updated (II, IV).
    Ignore(Why),
    /// Invalid (I, III): dropped.
    Invalid(Why),
}

fn max_ack_window(s: &Seen) -> u32 {
    s.maxwin.max(MAX_ACK_WINDOW)
}

impl Window {
    /// The state after the opening SYN (conntrack's `tcp_new`): the opener's end, window and
    /// options. [`Window::check`] then runs on that SYN as on any packet.
    pub fn open(seg: &Seg) -> Window {
        let end = seg.end();
        let (scale, flags) = seg.options();
        let mut w = Window::default();
        w.seen[0] = Seen {
            end,
            maxend: end,
            maxwin: u32::from(seg.win).max(1),
            maxack: 0,
            scale,
            flags,
        };
        w
    }

    /// A SYN (or SYN/ACK) sets its side anew (`tcp_init_sender`); scaling needs both sides'
    /// option (RFC 7323 §2.2).
    fn init_sender(&mut self, dir: usize, seg: &Seg) {
        let end = seg.end();
        let (scale, flags) = seg.options();
        self.seen[dir] = Seen {
            end,
            maxend: end,
            maxwin: u32::from(seg.win).max(1),
            maxack: 0,
            scale,
            flags,
        };
        if self.seen[dir].flags & WSCALE == 0 || self.seen[1 - dir].flags & WSCALE == 0 {
            self.seen[dir].scale = 0;
            self.seen[1 - dir].scale = 0;
        }
    }

    /// Resets a side to nothing seen (conntrack's `nf_ct_tcp_state_reset`).
    pub fn reset(&mut self, dir: usize) {
        self.seen[dir] = Seen::default();
    }

    /// Checks segment `seg` of class `class` from side `dir` (0 the opener) against the
    /// windows, in connection phase `phase`, and updates them when it is in window.
    /// `liberal` turns every out-of-window verdict into [`Check::Accept`] without an update
    /// (conntrack's `nf_conntrack_tcp_be_liberal`).
    pub fn check(
        &mut self,
        dir: usize,
        class: Segment,
        seg: &Seg,
        phase: Phase,
        liberal: bool,
    ) -> Check {
        let dir = dir & 1;
        let mut ack = seg.ack;
        let mut seq = seg.seq;
        let mut end = seg.end();
        let mut win = u32::from(seg.win);
        let mut sack = ack;
        if self.seen[1 - dir].flags & SACK_PERM != 0 {
            if let Some(s) = seg.sack {
                if after(s, sack) {
                    sack = s;
                }
            }
        }
        if self.seen[dir].maxwin == 0 {
            if seg.syn {
                self.init_sender(dir, seg);
                if !seg.ack_flag {
                    // Simultaneous open: the other side's SYN.
                    return Check::Accept;
                }
            } else {
                // Picked up in the middle (conntrack: after a flow came back from offload):
                // take the packet's word for it.
                let s = &mut self.seen[dir];
                s.end = end;
                let swin = win << s.scale;
                s.maxwin = swin.max(1);
                s.maxend = end.wrapping_add(s.maxwin);
                let r = &mut self.seen[1 - dir];
                if r.maxwin == 0 {
                    r.end = sack;
                    r.maxend = sack;
                } else if sack == r.end.wrapping_add(1) {
                    // A keepalive's answer.
                    r.end = r.end.wrapping_add(1);
                }
            }
        } else if seg.syn && after(end, self.seen[dir].end) && phase != Phase::Other {
            // RFC 9293 §3.4: a reinitialised TCP may reuse the tuple with a higher ISN.
            self.init_sender(dir, seg);
            if dir == 1 && !seg.ack_flag {
                return Check::Accept;
            }
        }
        if !seg.ack_flag || (seg.rst && ack == 0) {
            // No ack (or a broken stack's RST+ACK with ack 0): as if it acked everything.
            ack = self.seen[1 - dir].end;
            sack = ack;
        }
        if seg.rst && seq == 0 && phase == Phase::SynSent {
            // A RST answering a SYN.
            seq = self.seen[dir].end;
            end = seq;
        }
        let (sender, receiver) = (self.seen[dir], self.seen[1 - dir]);
        let out = |why| {
            if liberal {
                Check::Accept
            } else {
                Check::Invalid(why)
            }
        };
        let ignore = |why| {
            if liberal {
                Check::Accept
            } else {
                Check::Ignore(why)
            }
        };
        if !before(seq, sender.maxend.wrapping_add(1)) {
            // I failed. Conntrack still lets a sender overshoot by up to a window when all the
            // rest holds (TCPs that send a little more than allowed), recording its end.
            let overshot = end.wrapping_sub(sender.maxend).wrapping_add(1);
            let ack_ok = after(
                sack,
                receiver
                    .end
                    .wrapping_sub(max_ack_window(&sender))
                    .wrapping_sub(1),
            );
            let in_recv_win = receiver.maxwin != 0
                && after(
                    end,
                    sender.end.wrapping_sub(receiver.maxwin).wrapping_sub(1),
                );
            if in_recv_win
                && ack_ok
                && overshot <= receiver.maxwin
                && before(sack, receiver.end.wrapping_add(1))
            {
                self.seen[dir].end = end;
                return Check::Accept;
            }
            return out(Why::SeqAboveWindow);
        }
        if !before(sack, receiver.end.wrapping_add(1)) {
            return out(Why::AckAboveData);
        }
        let in_recv_win = receiver.maxwin == 0
            || after(
                end,
                sender.end.wrapping_sub(receiver.maxwin).wrapping_sub(1),
            );
        if !in_recv_win {
            return ignore(Why::SeqBelowWindow);
        }
        if !after(
            sack,
            receiver
                .end
                .wrapping_sub(max_ack_window(&sender))
                .wrapping_sub(1),
        ) {
            return ignore(Why::AckBelowWindow);
        }
        if !seg.syn {
            win <<= sender.scale;
        }
        let swin = win.wrapping_add(sack.wrapping_sub(ack));
        let s = &mut self.seen[dir];
        s.maxwin = s.maxwin.max(swin);
        if after(end, s.end) {
            s.end = end;
        }
        if seg.ack_flag {
            if s.flags & MAXACK_SET == 0 {
                s.maxack = ack;
                s.flags |= MAXACK_SET;
            } else if after(ack, s.maxack) {
                s.maxack = ack;
            }
        }
        let sender_maxend = s.maxend;
        let r = &mut self.seen[1 - dir];
        if r.maxwin != 0 && after(end, sender_maxend) {
            r.maxwin = r.maxwin.wrapping_add(end.wrapping_sub(sender_maxend));
        }
        if after(sack.wrapping_add(win), r.maxend.wrapping_sub(1)) {
            r.maxend = sack.wrapping_add(win);
            if win == 0 {
                r.maxend = r.maxend.wrapping_add(1);
            }
        }
        if class == Segment::Ack {
            self.last.end = end;
            self.last.ack = ack;
            self.last.win = seg.win;
        }
        Check::Accept
    }

    /// Bytes of [`Window::encode`].
    pub const ENCODED_LEN: usize = 2 * 18 + 15;

    /// Appends the fixed-size big-endian form: per side end, maxend, maxwin, maxack, scale,
    /// flags; then the last packet's class, side, end, ack, window, scale and flags; then the
    /// connection's flags.
    pub fn encode(&self, out: &mut Vec<u8>) {
        for s in &self.seen {
            for v in [s.end, s.maxend, s.maxwin, s.maxack] {
                out.extend_from_slice(&v.to_be_bytes());
            }
            out.extend_from_slice(&[s.scale, s.flags]);
        }
        let l = &self.last;
        out.extend_from_slice(&[l.seg, l.dir]);
        out.extend_from_slice(&l.end.to_be_bytes());
        out.extend_from_slice(&l.ack.to_be_bytes());
        out.extend_from_slice(&l.win.to_be_bytes());
        out.extend_from_slice(&[l.wscale, l.flags, self.flags]);
    }

    /// Reads [`Window::encode`]'s form.
    pub fn decode(input: &mut &[u8]) -> Result<Window, CodecError> {
        let Some((b, rest)) = input.split_first_chunk::<{ Window::ENCODED_LEN }>() else {
            return Err(CodecError::Truncated);
        };
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut w = Window::default();
        for (d, s) in w.seen.iter_mut().enumerate() {
            let o = d * 18;
            *s = Seen {
                end: u32_at(o),
                maxend: u32_at(o + 4),
                maxwin: u32_at(o + 8),
                maxack: u32_at(o + 12),
                scale: b[o + 16],
                flags: b[o + 17],
            };
            if s.scale > MAX_SCALE || s.flags & !(WSCALE | SACK_PERM | MAXACK_SET) != 0 {
                return Err(CodecError::Invalid("firewall window side"));
            }
        }
        w.last = Last {
            seg: b[36],
            dir: b[37],
            end: u32_at(38),
            ack: u32_at(42),
            win: u16::from_be_bytes([b[46], b[47]]),
            wscale: b[48],
            flags: b[49],
        };
        w.flags = b[50];
        if w.last.seg > Segment::MAX_CODE
            || w.last.dir > 1
            || w.last.wscale > MAX_SCALE
            || w.last.flags & !(WSCALE | SACK_PERM | CHALLENGE_ACK) != 0
            || w.flags & !(SIMULTANEOUS | SEEN_REPLY | ASSURED) != 0
        {
            return Err(CodecError::Invalid("firewall window"));
        }
        *input = rest;
        Ok(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const C: usize = 0;
    const S: usize = 1;

    fn syn(seq: u32, win: u16, wscale: Option<u8>) -> Seg {
        Seg {
            seq,
            win,
            syn: true,
            wscale,
            sack_perm: true,
            ..Seg::default()
        }
    }

    fn synack(seq: u32, ack: u32, win: u16, wscale: Option<u8>) -> Seg {
        Seg {
            ack,
            ack_flag: true,
            ..syn(seq, win, wscale)
        }
    }

    fn data(seq: u32, ack: u32, win: u16, len: u32) -> Seg {
        Seg {
            seq,
            ack,
            win,
            len,
            ack_flag: true,
            ..Seg::default()
        }
    }

    fn class(s: &Seg) -> Segment {
        match (s.syn, s.ack_flag, s.fin, s.rst) {
            (_, _, _, true) => Segment::Rst,
            (true, false, _, _) => Segment::Syn,
            (true, true, _, _) => Segment::SynAck,
            (_, _, true, _) => Segment::Fin,
            _ => Segment::Ack,
        }
    }

    fn check(w: &mut Window, dir: usize, s: Seg, phase: Phase) -> Check {
        w.check(dir, class(&s), &s, phase, false)
    }

    /// Client ISN `c`, window 64240 scale 7; server ISN `s`, window 65160 scale 7 (Linux's
    /// defaults); the client's ACK advertises 502 (× 128 = 64256).
    fn handshake(c: u32, s: u32) -> Window {
        let first = syn(c, 64240, Some(7));
        let mut w = Window::open(&first);
        assert_eq!(check(&mut w, C, first, Phase::Other), Check::Accept);
        let sa = synack(s, c.wrapping_add(1), 65160, Some(7));
        assert_eq!(check(&mut w, S, sa, Phase::SynSent), Check::Accept);
        let ack = data(c.wrapping_add(1), s.wrapping_add(1), 502, 0);
        assert_eq!(check(&mut w, C, ack, Phase::SynRecv), Check::Accept);
        w
    }

    #[test]
    fn the_handshake_sets_both_sides_by_hand() {
        let w = handshake(1000, 5000);
        // Client: end = ISN + 1 (the SYN), maxwin the scaled 502, maxend = the server's ack
        // + its SYN/ACK's unscaled window (1001 + 65160).
        assert_eq!(
            w.seen[C],
            Seen {
                end: 1001,
                maxend: 66161,
                maxwin: 64256,
                maxack: 5001,
                scale: 7,
                flags: WSCALE | SACK_PERM | MAXACK_SET,
            }
        );
        // Server: maxend = the client's ack + 502 << 7.
        assert_eq!(
            w.seen[S],
            Seen {
                end: 5001,
                maxend: 5001 + 64256,
                maxwin: 65160,
                maxack: 1001,
                scale: 7,
                flags: WSCALE | SACK_PERM | MAXACK_SET,
            }
        );
    }

    #[test]
    fn scaling_needs_both_sides_options() {
        let first = syn(1000, 64240, Some(7));
        let mut w = Window::open(&first);
        check(&mut w, C, first, Phase::Other);
        check(&mut w, S, synack(5000, 1001, 65160, None), Phase::SynSent);
        assert_eq!((w.seen[C].scale, w.seen[S].scale), (0, 0));
        check(&mut w, C, data(1001, 5001, 502, 0), Phase::SynRecv);
        // 502 unscaled: the server may send up to 5001 + 502.
        assert_eq!(w.seen[S].maxend, 5001 + 502);
        assert_eq!(
            check(&mut w, S, data(5001, 1001, 65160, 502), Phase::Other),
            Check::Accept
        );
        // A scale option above 14 counts as 14 (RFC 7323 §2.3).
        assert_eq!(Window::open(&syn(1, 1, Some(200))).seen[C].scale, MAX_SCALE);
    }

    #[test]
    fn data_far_past_the_window_is_invalid_a_little_past_it_is_tolerated() {
        let mut w = handshake(1000, 5000);
        let maxend = w.seen[S].maxend;
        // Starting at maxend + 1 with 1000 bytes: overshoot 1002 <= the client's maxwin, all
        // else holds: accepted and recorded (conntrack's work-around for eager senders).
        assert_eq!(
            check(&mut w, S, data(maxend + 1, 1001, 509, 1000), Phase::Other),
            Check::Accept
        );
        assert_eq!(w.seen[S].end, maxend + 1001);
        let before = w;
        // A megabyte past it: invalid, nothing changes.
        assert_eq!(
            check(
                &mut w,
                S,
                data(maxend + 1_000_000, 1001, 509, 100),
                Phase::Other
            ),
            Check::Invalid(Why::SeqAboveWindow)
        );
        assert_eq!(w, before);
        // Liberal: passes, nothing changes either.
        let s = data(maxend + 1_000_000, 1001, 509, 100);
        assert_eq!(
            w.check(S, Segment::Ack, &s, Phase::Other, true),
            Check::Accept
        );
        assert_eq!(w, before);
    }

    #[test]
    fn an_ack_of_unsent_data_is_invalid_an_old_one_ignored() {
        let mut w = handshake(1000, 5000);
        // The server sent up to 5001: the client may ack 5001, not 5002.
        assert_eq!(
            check(&mut w, C, data(1001, 5002, 502, 0), Phase::Other),
            Check::Invalid(Why::AckAboveData)
        );
        assert_eq!(
            check(&mut w, C, data(1001, 5001, 502, 0), Phase::Other),
            Check::Accept
        );
        // An ack more than max(maxwin, 66000) below the server's end: overly delayed.
        assert_eq!(
            check(
                &mut w,
                C,
                data(1001, 5001u32.wrapping_sub(70_000), 502, 0),
                Phase::Other
            ),
            Check::Ignore(Why::AckBelowWindow)
        );
    }

    #[test]
    fn retransmissions_pass_old_ones_are_ignored() {
        let mut w = handshake(1000, 5000);
        for i in 0..40u32 {
            let seq = 5001 + i * 1000;
            assert_eq!(
                check(&mut w, S, data(seq, 1001, 509, 1000), Phase::Other),
                Check::Accept
            );
            check(&mut w, C, data(1001, seq + 1000, 502, 0), Phase::Other);
        }
        // The last segment again: in window.
        let last = data(5001 + 39 * 1000, 1001, 509, 1000);
        assert_eq!(check(&mut w, S, last, Phase::Other), Check::Accept);
        // The first: it ends 39000 below the server's end, past the client's window (64256)?
        // No: 5001 + 1000 > 45001 - 64256 - 1. In window.
        assert_eq!(
            check(&mut w, S, data(5001, 1001, 509, 1000), Phase::Other),
            Check::Accept
        );
        // Push the server's end 200000 further; the first segment is now older than a window.
        for i in 0..200u32 {
            let seq = 45_001 + i * 1000;
            check(&mut w, S, data(seq, 1001, 509, 1000), Phase::Other);
            check(&mut w, C, data(1001, seq + 1000, 502, 0), Phase::Other);
        }
        assert_eq!(w.seen[S].end, 245_001);
        assert_eq!(
            check(&mut w, S, data(5001, 1001, 509, 1000), Phase::Other),
            Check::Ignore(Why::SeqBelowWindow)
        );
    }

    #[test]
    fn sequence_numbers_wrap() {
        let c = u32::MAX - 500;
        let s = u32::MAX - 10;
        let mut w = handshake(c, s);
        // Both sides send 2000 bytes across 2^32.
        let mut seq = s.wrapping_add(1);
        let mut cseq = c.wrapping_add(1);
        for _ in 0..4 {
            assert_eq!(
                check(&mut w, S, data(seq, cseq, 509, 500), Phase::Other),
                Check::Accept
            );
            seq = seq.wrapping_add(500);
            assert_eq!(
                check(&mut w, C, data(cseq, seq, 502, 500), Phase::Other),
                Check::Accept
            );
            cseq = cseq.wrapping_add(500);
        }
        assert_eq!(w.seen[S].end, s.wrapping_add(2001));
        assert_eq!(w.seen[C].end, c.wrapping_add(2001));
        assert!(w.seen[S].end < 2000 && w.seen[C].end < 2000);
        // Past the window after the wrap is still past it.
        assert_eq!(
            check(
                &mut w,
                S,
                data(seq.wrapping_add(2_000_000), cseq, 509, 1),
                Phase::Other
            ),
            Check::Invalid(Why::SeqAboveWindow)
        );
    }

    #[test]
    fn a_zero_window_allows_one_probe_byte() {
        let mut w = handshake(1000, 5000);
        // The client closes its window after 1000 bytes.
        check(&mut w, S, data(5001, 1001, 509, 1000), Phase::Other);
        check(&mut w, C, data(1001, 6001, 0, 0), Phase::Other);
        // maxend stays at the largest seen (5001 + 64256): a zero window never shrinks it,
        // and the probe (1 byte at 6001) passes.
        assert_eq!(w.seen[S].maxend, 5001 + 64256);
        assert_eq!(
            check(&mut w, S, data(6001, 1001, 509, 1), Phase::Other),
            Check::Accept
        );
        // A zero window on a fresh side sets maxend = ack + 1.
        let first = syn(1000, 0, None);
        let mut w = Window::open(&first);
        check(&mut w, C, first, Phase::Other);
        check(&mut w, S, synack(5000, 1001, 0, None), Phase::SynSent);
        assert_eq!(w.seen[C].maxend, 1002);
        assert_eq!(
            check(&mut w, C, data(1001, 5001, 0, 1), Phase::SynRecv),
            Check::Accept
        );
    }

    #[test]
    fn sack_edges_count_as_acks() {
        let mut w = handshake(1000, 5000);
        check(&mut w, S, data(5001, 1001, 509, 3000), Phase::Other);
        // Ack 5001, SACK up to 8001 (all sent): fine; up to 8002: data never sent.
        let mut s = data(1001, 5001, 502, 0);
        s.sack = Some(8001);
        assert_eq!(check(&mut w, C, s, Phase::Other), Check::Accept);
        s.sack = Some(8002);
        assert_eq!(
            check(&mut w, C, s, Phase::Other),
            Check::Invalid(Why::AckAboveData)
        );
    }

    /// A header read by hand: the first SACK option's highest right edge, read only when asked
    /// for; a SYN's window scale and SACK-permitted always.
    #[test]
    fn segments_are_read_from_the_header() {
        let mut b = vec![0u8; 20];
        b[4..8].copy_from_slice(&100u32.to_be_bytes()); // seq
        b[8..12].copy_from_slice(&200u32.to_be_bytes()); // ack
        b[13] = 0x10; // ACK
        b[14..16].copy_from_slice(&502u16.to_be_bytes());
        // NOP, NOP, SACK with one block [0xFFFF_FFF0, 16): its right edge wrapped past 2^32,
        // then a block ending at 300 in a second SACK option, which is not read.
        b.extend_from_slice(&[1, 1, 5, 10]);
        b.extend_from_slice(&0xFFFF_FFF0u32.to_be_bytes());
        b.extend_from_slice(&16u32.to_be_bytes());
        b.extend_from_slice(&[1, 1, 5, 10]);
        b.extend_from_slice(&1u32.to_be_bytes());
        b.extend_from_slice(&300u32.to_be_bytes());
        b[12] = 11 << 4; // 44-byte header
        b.extend_from_slice(b"data");
        let p = tcp::Packet::new_checked(&b[..]).unwrap();
        let s = Seg::read(&p, true);
        assert_eq!((s.seq, s.ack, s.win, s.len), (100, 200, 502, 4));
        assert_eq!(s.sack, Some(16));
        assert_eq!(s.end(), 104);
        assert_eq!(Seg::read(&p, false).sack, None);
        // A SYN: window scale 7 and SACK-permitted.
        let mut syn = b[..20].to_vec();
        syn[12] = 7 << 4; // 28-byte header
        syn[13] = 0x02;
        syn.extend_from_slice(&[1, 3, 3, 7, 4, 2, 1, 1]);
        let p = tcp::Packet::new_checked(&syn[..]).unwrap();
        let s = Seg::read(&p, false);
        assert_eq!(
            (s.wscale, s.sack_perm, s.syn, s.end()),
            (Some(7), true, true, 101)
        );
    }

    #[test]
    fn a_rst_answering_a_syn_with_seq_zero_passes() {
        let first = syn(1000, 64240, Some(7));
        let mut w = Window::open(&first);
        check(&mut w, C, first, Phase::Other);
        let rst = Seg {
            seq: 0,
            ack: 1001,
            ack_flag: true,
            rst: true,
            ..Seg::default()
        };
        assert_eq!(check(&mut w, S, rst, Phase::SynSent), Check::Accept);
    }

    #[test]
    fn simultaneous_open_sets_the_second_side_from_its_syn() {
        let first = syn(1000, 64240, Some(7));
        let mut w = Window::open(&first);
        check(&mut w, C, first, Phase::Other);
        assert_eq!(
            check(&mut w, S, syn(5000, 65160, Some(7)), Phase::SynSent),
            Check::Accept
        );
        assert_eq!((w.seen[S].end, w.seen[S].scale), (5001, 7));
        assert_eq!(
            check(
                &mut w,
                C,
                synack(1000, 5001, 64240, Some(7)),
                Phase::SynSent
            ),
            Check::Accept
        );
        assert_eq!(
            check(
                &mut w,
                S,
                synack(5000, 1001, 65160, Some(7)),
                Phase::SynRecv
            ),
            Check::Accept
        );
    }

    #[test]
    fn picked_up_mid_stream_takes_the_packets_word() {
        let mut w = Window::default();
        assert_eq!(
            check(&mut w, C, data(7000, 9000, 1000, 100), Phase::Other),
            Check::Accept
        );
        assert_eq!(w.seen[C].end, 7100);
        assert_eq!(w.seen[S].end, 9000);
    }

    #[test]
    fn encoding_round_trips_and_rejects_garbage() {
        let w = handshake(1000, 5000);
        let mut out = Vec::new();
        w.encode(&mut out);
        assert_eq!(out.len(), Window::ENCODED_LEN);
        let mut input = &out[..];
        assert_eq!(Window::decode(&mut input).unwrap(), w);
        assert!(input.is_empty());
        assert_eq!(Window::decode(&mut &out[..10]), Err(CodecError::Truncated));
        let mut bad = out.clone();
        bad[16] = 15; // scale above 14
        assert!(Window::decode(&mut &bad[..]).is_err());
        proptest!(|(bytes in proptest::collection::vec(any::<u8>(), 0..80))| {
            // Never panics; what decodes encodes to the same bytes.
            let mut input = &bytes[..];
            if let Ok(w) = Window::decode(&mut input) {
                let mut again = Vec::new();
                w.encode(&mut again);
                prop_assert_eq!(&again[..], &bytes[..Window::ENCODED_LEN]);
            }
        });
    }

    proptest! {
        /// A well-behaved bulk transfer in both directions, with any ISNs (wrapping), window
        /// scales, segment sizes and windows, is always in window.
        #[test]
        fn a_well_behaved_transfer_is_always_in_window(
            c in any::<u32>(), s in any::<u32>(),
            cs in 0u8..=14, ss in 0u8..=14,
            win in 1u16..=u16::MAX,
            sizes in proptest::collection::vec(0u32..1460, 1..60),
        ) {
            let first = syn(c, 64240, Some(cs));
            let mut w = Window::open(&first);
            prop_assert_eq!(check(&mut w, C, first, Phase::Other), Check::Accept);
            prop_assert_eq!(
                check(&mut w, S, synack(s, c.wrapping_add(1), 65160, Some(ss)), Phase::SynSent),
                Check::Accept
            );
            let (mut cseq, mut sseq) = (c.wrapping_add(1), s.wrapping_add(1));
            prop_assert_eq!(
                check(&mut w, C, data(cseq, sseq, win, 0), Phase::SynRecv),
                Check::Accept
            );
            for (i, n) in sizes.iter().enumerate() {
                // Each side sends at most what the other's window allows, then is acked.
                let n = (*n).min(u32::from(win)).min(65160);
                let (dir, seq, ack) = if i % 2 == 0 { (S, sseq, cseq) } else { (C, cseq, sseq) };
                prop_assert_eq!(check(&mut w, dir, data(seq, ack, win, n), Phase::Other), Check::Accept);
                let end = seq.wrapping_add(n);
                if dir == S { sseq = end } else { cseq = end }
                let (ack_seq, acked) = if dir == S { (cseq, sseq) } else { (sseq, cseq) };
                prop_assert_eq!(
                    check(&mut w, 1 - dir, data(ack_seq, acked, win, 0), Phase::Other),
                    Check::Accept
                );
            }
        }
    }
}
