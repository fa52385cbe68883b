//! Fuzzes the state store protocol's decoder as a server meets it: frames back to back in one
//! buffer, under default and tight limits. Nothing may panic; every frame that decodes must
//! encode to bytes that decode to the same frame; the borrowed batch decoder (the server's hot
//! path) must agree with the owned one on every batch frame.
//!
//! Run with `cargo +nightly fuzz run proto` from the repository root.

#![no_main]

use flowstate_proto::{
    decode, decode_batch_into, encode, peek_header, Limits, Message, Request, HEADER_LEN,
};
use libfuzzer_sys::fuzz_target;

fn frames(mut buf: &[u8], limits: &Limits) {
    let mut ops: Vec<Request<&[u8]>> = Vec::new();
    while let Ok(Some((frame, used))) = decode(buf, limits) {
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
        let (again, n) = decode(&out, &Limits::default())
            .expect("an encoded frame decodes")
            .expect("an encoded frame is whole");
        assert_eq!(n, out.len());
        assert_eq!(again, frame);
        buf = &buf[used..];
    }
}

fuzz_target!(|data: &[u8]| {
    frames(data, &Limits::default());
    frames(
        data,
        &Limits {
            max_frame: 64,
            max_ops: 2,
        },
    );
});
