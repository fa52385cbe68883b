//! NAT events as IPFIX messages (RFC 7011) with the information elements of RFC 8158.
//!
//! One template per event shape (RFC 8158 §4.1): NAT44 session create and delete (§4.1.1),
//! NAT44 BIB (mapping) create and delete (§4.1.3), NAT ports exhausted (§4.1.6), quota
//! exceeded for the maximum session entries (§4.1.7). Records of one template that follow each
//! other share a data set; a message never grows beyond the path MTU.

use super::events::{Event, EventKind};
use std::net::Ipv4Addr;

/// IPFIX version number (RFC 7011 §3.1).
const VERSION: u16 = 10;
/// Set ID of a template set (RFC 7011 §3.3.2).
const TEMPLATE_SET: u16 = 2;
const SET_HEADER: usize = 4;

// Information elements (IANA IPFIX registry): (id, length).
const OBSERVATION_TIME_MS: (u16, u16) = (323, 8);
const NAT_EVENT: (u16, u16) = (230, 1);
const INGRESS_VRF_ID: (u16, u16) = (234, 4);
const SOURCE_IPV4: (u16, u16) = (8, 4);
const POST_NAT_SOURCE_IPV4: (u16, u16) = (225, 4);
const PROTOCOL: (u16, u16) = (4, 1);
const SOURCE_PORT: (u16, u16) = (7, 2);
const POST_NAPT_SOURCE_PORT: (u16, u16) = (227, 2);
const DESTINATION_IPV4: (u16, u16) = (12, 4);
const POST_NAT_DESTINATION_IPV4: (u16, u16) = (226, 4);
const DESTINATION_PORT: (u16, u16) = (11, 2);
const POST_NAPT_DESTINATION_PORT: (u16, u16) = (228, 2);
const NAT_QUOTA_EXCEEDED_EVENT: (u16, u16) = (466, 4);
const MAX_SESSION_ENTRIES: (u16, u16) = (471, 4);

/// A NAT44 BIB (mapping) record (RFC 8158 §4.1.3): the inside endpoint and its translation.
const BIB_FIELDS: [(u16, u16); 8] = [
    OBSERVATION_TIME_MS,
    NAT_EVENT,
    INGRESS_VRF_ID,
    SOURCE_IPV4,
    POST_NAT_SOURCE_IPV4,
    PROTOCOL,
    SOURCE_PORT,
    POST_NAPT_SOURCE_PORT,
];

/// A NAT44 session record (RFC 8158 §4.1.1): a BIB record and the destination, before and
/// after translation.
const SESSION_FIELDS: [(u16, u16); 12] = {
    let mut f = [(0, 0); 12];
    let mut i = 0;
    while i < BIB_FIELDS.len() {
        f[i] = BIB_FIELDS[i];
        i += 1;
    }
    f[8] = DESTINATION_IPV4;
    f[9] = POST_NAT_DESTINATION_IPV4;
    f[10] = DESTINATION_PORT;
    f[11] = POST_NAPT_DESTINATION_PORT;
    f
};

/// The templates: (template id, fields).
const TEMPLATES: [(u16, &[(u16, u16)]); 4] = [
    (SESSION, &SESSION_FIELDS),
    (BIB, &BIB_FIELDS),
    (
        PORTS_EXHAUSTED,
        &[OBSERVATION_TIME_MS, NAT_EVENT, POST_NAT_SOURCE_IPV4],
    ),
    (
        QUOTA,
        &[
            OBSERVATION_TIME_MS,
            NAT_EVENT,
            NAT_QUOTA_EXCEEDED_EVENT,
            MAX_SESSION_ENTRIES,
        ],
    ),
];
const SESSION: u16 = 256;
const BIB: u16 = 257;
const PORTS_EXHAUSTED: u16 = 258;
const QUOTA: u16 = 259;

/// natEvent values (IANA "NAT Event Type").
fn nat_event(kind: EventKind) -> u8 {
    match kind {
        EventKind::SessionCreate => 4,
        EventKind::SessionDelete => 5,
        EventKind::MappingCreate => 8,
        EventKind::MappingDelete => 9,
        EventKind::PortsExhausted => 12,
        EventKind::QuotaExceeded => 13,
    }
}

fn template_of(kind: EventKind) -> u16 {
    match kind {
        EventKind::SessionCreate | EventKind::SessionDelete => SESSION,
        EventKind::MappingCreate | EventKind::MappingDelete => BIB,
        EventKind::PortsExhausted => PORTS_EXHAUSTED,
        EventKind::QuotaExceeded => QUOTA,
    }
}

/// Builds IPFIX messages of one observation domain, numbered as RFC 7011 §3.1 asks (the
/// sequence number counts the data records sent before the message).
#[derive(Debug)]
pub(super) struct Encoder {
    domain: u32,
    mtu: usize,
    /// Data records in messages finished so far (mod 2^32).
    sequence: u32,
    /// Records in the message being built.
    records: u32,
    buf: Vec<u8>,
    /// Where the open data set starts, and its template.
    set: Option<(usize, u16)>,
}

impl Encoder {
    /// An encoder whose messages hold at most `mtu` bytes (at least 64).
    pub(super) fn new(domain: u32, mtu: usize) -> Encoder {
        let mtu = mtu.max(64);
        Encoder {
            domain,
            mtu,
            sequence: 0,
            records: 0,
            buf: Vec::with_capacity(mtu),
            set: None,
        }
    }

    /// A message with every template (RFC 7011 §8: sent first, and again on schedule over
    /// UDP, §10.3.6), stamped `export_secs`.
    pub(super) fn templates(&self, export_secs: u32) -> Vec<u8> {
        let mut m = Vec::with_capacity(128);
        header(&mut m, export_secs, self.sequence, self.domain);
        let set = m.len();
        put16(&mut m, TEMPLATE_SET);
        put16(&mut m, 0);
        for (id, fields) in TEMPLATES {
            put16(&mut m, id);
            put16(&mut m, fields.len() as u16);
            for (ie, len) in fields {
                put16(&mut m, *ie);
                put16(&mut m, *len);
            }
        }
        let set_len = (m.len() - set) as u16;
        m[set + 2..set + 4].copy_from_slice(&set_len.to_be_bytes());
        let len = m.len() as u16;
        m[2..4].copy_from_slice(&len.to_be_bytes());
        m
    }

    /// Adds `e`'s record; a message that had no room for it is finished first and handed to
    /// `send`.
    pub(super) fn push(&mut self, e: &Event, export_secs: u32, send: &mut impl FnMut(&[u8])) {
        let template = template_of(e.kind);
        let size = record_len(template);
        let opens_set = self.set.map(|(_, t)| t) != Some(template);
        let need = size + if opens_set { SET_HEADER } else { 0 };
        if !self.buf.is_empty() && self.buf.len() + need > self.mtu {
            self.finish(send);
        }
        if self.buf.is_empty() {
            header(&mut self.buf, export_secs, self.sequence, self.domain);
        }
        if self.set.map(|(_, t)| t) != Some(template) {
            self.close_set();
            self.set = Some((self.buf.len(), template));
            put16(&mut self.buf, template);
            put16(&mut self.buf, 0);
        }
        encode(&mut self.buf, e);
        self.records += 1;
    }

    /// Finishes the message being built, if any, and hands it to `send`.
    pub(super) fn finish(&mut self, send: &mut impl FnMut(&[u8])) {
        if self.buf.is_empty() {
            return;
        }
        self.close_set();
        let len = self.buf.len() as u16;
        self.buf[2..4].copy_from_slice(&len.to_be_bytes());
        send(&self.buf);
        self.sequence = self.sequence.wrapping_add(self.records);
        self.records = 0;
        self.buf.clear();
    }

    fn close_set(&mut self) {
        if let Some((at, _)) = self.set.take() {
            let len = (self.buf.len() - at) as u16;
            self.buf[at + 2..at + 4].copy_from_slice(&len.to_be_bytes());
        }
    }
}

fn record_len(template: u16) -> usize {
    TEMPLATES
        .iter()
        .find(|(id, _)| *id == template)
        .map_or(0, |(_, f)| f.iter().map(|(_, l)| usize::from(*l)).sum())
}

fn header(m: &mut Vec<u8>, export_secs: u32, sequence: u32, domain: u32) {
    put16(m, VERSION);
    put16(m, 0); // length, set when finished
    m.extend_from_slice(&export_secs.to_be_bytes());
    m.extend_from_slice(&sequence.to_be_bytes());
    m.extend_from_slice(&domain.to_be_bytes());
}

fn put16(m: &mut Vec<u8>, v: u16) {
    m.extend_from_slice(&v.to_be_bytes());
}

fn put_ip(m: &mut Vec<u8>, a: Ipv4Addr) {
    m.extend_from_slice(&a.octets());
}

/// `e`'s record, in its template's field order.
fn encode(m: &mut Vec<u8>, e: &Event) {
    m.extend_from_slice(&(e.at / 1_000_000).to_be_bytes());
    m.push(nat_event(e.kind));
    match template_of(e.kind) {
        SESSION | BIB => {
            m.extend_from_slice(&0u32.to_be_bytes()); // one routing context
            put_ip(m, e.inside.0);
            put_ip(m, e.external.0);
            m.push(e.proto);
            put16(m, e.inside.1);
            put16(m, e.external.1);
            if template_of(e.kind) == SESSION {
                // NAT44 leaves the destination as it is.
                put_ip(m, e.remote.0);
                put_ip(m, e.remote.0);
                put16(m, e.remote.1);
                put16(m, e.remote.1);
            }
        }
        PORTS_EXHAUSTED => put_ip(m, e.external.0),
        _ => {
            m.extend_from_slice(&1u32.to_be_bytes()); // maximum session entries exceeded
            m.extend_from_slice(&e.limit.to_be_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: EventKind, port: u16) -> Event {
        Event {
            kind,
            at: 1_700_000_000_123_456_789,
            proto: 6,
            inside: (Ipv4Addr::new(10, 0, 0, 2), port),
            remote: (Ipv4Addr::new(198, 51, 100, 2), 80),
            external: (Ipv4Addr::new(203, 0, 113, 1), 20_000 + port),
            limit: 7,
        }
    }

    fn u16_at(m: &[u8], at: usize) -> u16 {
        u16::from_be_bytes([m[at], m[at + 1]])
    }

    #[test]
    fn messages_stay_within_the_mtu_and_number_their_records() {
        let mut enc = Encoder::new(7, 200);
        let mut sent: Vec<Vec<u8>> = Vec::new();
        let mut send = |m: &[u8]| sent.push(m.to_vec());
        for i in 0..20 {
            let kind = if i % 3 == 2 {
                EventKind::MappingCreate
            } else {
                EventKind::SessionCreate
            };
            enc.push(&event(kind, i), 99, &mut send);
        }
        enc.finish(&mut send);
        assert!(sent.len() > 2);
        let mut records = 0u32;
        for m in &sent {
            assert!(m.len() <= 200, "{}", m.len());
            assert_eq!(u16_at(m, 0), 10);
            assert_eq!(usize::from(u16_at(m, 2)), m.len());
            assert_eq!(u32::from_be_bytes(m[4..8].try_into().unwrap()), 99);
            assert_eq!(u32::from_be_bytes(m[8..12].try_into().unwrap()), records);
            assert_eq!(u32::from_be_bytes(m[12..16].try_into().unwrap()), 7);
            // Walk the sets: each a known template, its records whole.
            let mut at = 16;
            while at < m.len() {
                let (id, len) = (u16_at(m, at), usize::from(u16_at(m, at + 2)));
                let size = record_len(id);
                assert!(size > 0 && (len - 4) % size == 0, "set {id} of {len}");
                records += ((len - 4) / size) as u32;
                at += len;
            }
            assert_eq!(at, m.len());
        }
        assert_eq!(records, 20);
        assert_eq!(enc.sequence, 20);
    }

    #[test]
    fn the_template_set_declares_every_record_shape() {
        let m = Encoder::new(1, 1400).templates(5);
        assert_eq!(usize::from(u16_at(&m, 2)), m.len());
        assert_eq!(u16_at(&m, 16), TEMPLATE_SET);
        let mut at = 20;
        let mut ids = Vec::new();
        while at < m.len() {
            let (id, n) = (u16_at(&m, at), usize::from(u16_at(&m, at + 2)));
            ids.push(id);
            at += 4 + 4 * n;
        }
        assert_eq!(at, m.len());
        assert_eq!(ids, [SESSION, BIB, PORTS_EXHAUSTED, QUOTA]);
        assert_eq!(record_len(SESSION), 38);
        let mut one = Vec::new();
        encode(&mut one, &event(EventKind::SessionDelete, 1));
        assert_eq!(one.len(), 38);
        assert_eq!(one[8], 5);
    }
}
