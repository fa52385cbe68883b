//! The checks of the `proto` fuzz target, on one input, shared by the cargo-fuzz target
//! (`fuzz/fuzz_targets/proto.rs`) and its stable harness (`crates/proto/tests/fuzz_proto.rs`).

use flowstate_proto::{
    decode, decode_batch_into, encode, peek_header, Limits, Message, Request, HEADER_LEN,
};

/// Decodes `buf` as a stream of frames under `limits`, checking what the fuzz target checks.
/// Returns the frames decoded.
pub(crate) fn frames(mut buf: &[u8], limits: &Limits) -> usize {
    let mut ops: Vec<Request<&[u8]>> = Vec::new();
    let mut n = 0;
    loop {
        let (frame, used) = match decode(buf, limits) {
            Ok(Some(x)) => x,
            Ok(None) => {
                // Wanting more bytes is only right when the length field says so.
                if let Some(len) = buf.get(..4) {
                    let len = u32::from_le_bytes(len.try_into().unwrap()) as usize;
                    assert!(buf.len() < 4 + len || buf.len() < HEADER_LEN);
                }
                return n;
            }
            Err(_) => return n,
        };
        n += 1;
        assert!(used >= HEADER_LEN && used <= buf.len());
        if let Message::Batch {
            op_id,
            ack_only,
            ops: owned,
        } = &frame.msg
        {
            let h = peek_header(buf, limits)
                .expect("a decoded frame's header")
                .expect("a whole header");
            let borrowed = decode_batch_into(&h, &buf[HEADER_LEN..used], limits, &mut ops);
            assert_eq!(borrowed.ok(), Some((*op_id, *ack_only)));
            assert!(ops.iter().map(Request::owned).eq(owned.iter().cloned()));
        }
        let mut out = Vec::new();
        encode(&frame, &mut out);
        let (again, m) = decode(&out, &Limits::default())
            .expect("an encoded frame decodes")
            .expect("an encoded frame is whole");
        assert_eq!(m, out.len());
        assert_eq!(again, frame);
        buf = &buf[used..];
    }
}

/// Everything checked on one input: the stream under the default and tight limits.
pub(crate) fn check(input: &[u8]) {
    frames(input, &Limits::default());
    frames(
        input,
        &Limits {
            max_frame: 64,
            max_ops: 2,
        },
    );
}
