//! Fuzz/property target for the registration relay (`authority::relay`),
//! which decodes the kubelet's HTTP/2 header blocks (HPACK) and encodes them
//! again: any byte stream is relayed or refused, never a panic or a hang,
//! with output bounded by input; well-formed streams come out with the same
//! headers, `:authority` made `localhost` where it is no authority. See
//! docs/fuzzing.md.

#![allow(missing_docs)]

use std::time::{Duration, Instant};

use loona_hpack::{Decoder, Encoder};
use proptest::{
    prelude::*,
    test_runner::{Config, TestCaseError, TestRunner},
};
use tessera_draplugin::authority::relay;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// One header block's headers, as (name, value) bytes.
type Block = Vec<(Vec<u8>, Vec<u8>)>;

/// One frame of a generated stream.
#[derive(Clone, Debug)]
enum Frame {
    /// A header block of these headers, split over HEADERS and
    /// CONTINUATION frames of at most `split` bytes (padded or with
    /// priority fields when asked).
    Headers {
        stream: u32,
        headers: Vec<(String, String)>,
        split: usize,
        padded: bool,
        priority: bool,
    },
    /// Any other frame, passed on untouched.
    Other {
        kind: u8,
        flags: u8,
        stream: u32,
        payload: Vec<u8>,
    },
    /// Raw bytes (a broken frame).
    Raw(Vec<u8>),
}

fn header() -> impl Strategy<Value = (String, String)> {
    prop_oneof![
        Just((":method".to_owned(), "POST".to_owned())),
        Just((
            ":path".to_owned(),
            "/pluginregistration.Registration/GetInfo".to_owned()
        )),
        prop_oneof![
            Just("%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fx.sock".to_owned()),
            Just("localhost".to_owned()),
            Just("127.0.0.1:8080".to_owned()),
            "\\PC{0,40}",
        ]
        .prop_map(|v| (":authority".to_owned(), v)),
        ("[a-z-]{1,12}", "[ -~]{0,40}"),
    ]
}

fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        4 => (1u32..9, prop::collection::vec(header(), 0..8), 1usize..64, any::<bool>(), any::<bool>())
            .prop_map(|(stream, headers, split, padded, priority)| Frame::Headers {
                stream, headers, split, padded, priority,
            }),
        2 => (prop::sample::select(vec![0u8, 3, 4, 6, 7, 8, 0x42]), any::<u8>(), 0u32..9,
              prop::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(kind, flags, stream, payload)| Frame::Other { kind, flags: flags & !0x4, stream, payload }),
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(Frame::Raw),
    ]
}

fn head(length: usize, kind: u8, flags: u8, stream: u32) -> Vec<u8> {
    let length = (length as u32).to_be_bytes();
    let mut head = length[1..].to_vec();
    head.extend([kind, flags]);
    head.extend(stream.to_be_bytes());
    head
}

/// The stream's bytes, and the header lists a correct relay passes on
/// (`None` once a raw frame may have broken the framing).
fn encode(frames: &[Frame]) -> (Vec<u8>, Option<Vec<Block>>) {
    let mut out = PREFACE.to_vec();
    let mut encoder = Encoder::new();
    let mut expected = Some(Vec::new());
    for frame in frames {
        match frame {
            Frame::Headers {
                stream,
                headers,
                split,
                padded,
                priority,
            } => {
                let block =
                    encoder.encode(headers.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())));
                let chunks: Vec<&[u8]> = if block.is_empty() {
                    vec![&block[..]]
                } else {
                    block.chunks(*split).collect()
                };
                for (i, chunk) in chunks.iter().enumerate() {
                    let last = i + 1 == chunks.len();
                    let end_headers = if last { 0x4 } else { 0 };
                    if i == 0 {
                        let mut payload = Vec::new();
                        let mut flags = end_headers;
                        if *padded {
                            flags |= 0x8;
                            payload.push(2);
                        }
                        if *priority {
                            flags |= 0x20;
                            payload.extend([0, 0, 0, 0, 16]);
                        }
                        payload.extend_from_slice(chunk);
                        if *padded {
                            payload.extend([0, 0]);
                        }
                        out.extend(head(payload.len(), 0x1, flags, *stream));
                        out.extend(payload);
                    } else {
                        out.extend(head(chunk.len(), 0x9, end_headers, *stream));
                        out.extend_from_slice(chunk);
                    }
                }
                if let Some(expected) = expected.as_mut() {
                    expected.push(
                        headers
                            .iter()
                            .map(|(n, v)| {
                                let value = if n == ":authority"
                                    && http::uri::Authority::try_from(v.as_str()).is_err()
                                {
                                    "localhost".to_owned()
                                } else {
                                    v.clone()
                                };
                                (n.clone().into_bytes(), value.into_bytes())
                            })
                            .collect(),
                    );
                }
            }
            Frame::Other {
                kind,
                flags,
                stream,
                payload,
            } => {
                out.extend(head(payload.len(), *kind, *flags, *stream));
                out.extend(payload);
            }
            Frame::Raw(bytes) => {
                out.extend(bytes);
                expected = None;
            }
        }
    }
    (out, expected)
}

/// Runs the relay over `input` (then end of stream): what reached the
/// server, and whether the relay finished.
fn run_relay(input: Vec<u8>) -> (Vec<u8>, bool) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let (mut kubelet, client) = tokio::io::duplex(1 << 20);
        let (server, mut plugin) = tokio::io::duplex(1 << 20);
        let relayed = tokio::spawn(relay(client, server));
        let writer = tokio::spawn(async move {
            let _ = kubelet.write_all(&input).await;
            let _ = kubelet.shutdown().await;
            // Keep the kubelet's side open until the relay is done.
            let mut sink = Vec::new();
            let _ = kubelet.read_to_end(&mut sink).await;
        });
        let mut received = Vec::new();
        let reader = async {
            let _ = plugin.read_to_end(&mut received).await;
        };
        let finished = tokio::time::timeout(Duration::from_secs(5), async {
            let _ = relayed.await;
        });
        let (_, finished) = tokio::join!(
            tokio::time::timeout(Duration::from_secs(5), reader),
            finished
        );
        writer.abort();
        (received, finished.is_ok())
    })
}

/// The header lists of the HEADERS/CONTINUATION blocks in `output`.
fn header_blocks(output: &[u8]) -> Option<Vec<Block>> {
    let mut at = output.strip_prefix(PREFACE.as_slice())?;
    let mut decoder = Decoder::new();
    let mut blocks = Vec::new();
    let mut block: Vec<u8> = Vec::new();
    while at.len() >= 9 {
        let length = usize::from(at[0]) << 16 | usize::from(at[1]) << 8 | usize::from(at[2]);
        let (kind, flags) = (at[3], at[4]);
        let payload = at.get(9..9 + length)?;
        at = &at[9 + length..];
        if kind == 0x1 || kind == 0x9 {
            block.extend_from_slice(payload);
            if flags & 0x4 != 0 {
                let mut headers = Vec::new();
                decoder
                    .decode_with_cb(&block, |n, v| {
                        headers.push((n.into_owned(), v.into_owned()))
                    })
                    .ok()?;
                blocks.push(headers);
                block.clear();
            }
        }
    }
    Some(blocks)
}

#[test]
fn fuzz_registration_relay() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let started = Instant::now();
    let mut runner = TestRunner::new(config);
    let streams = (
        prop::collection::vec(frame(), 0..12),
        prop::option::weighted(0.1, prop::collection::vec(any::<u8>(), 0..24)),
    );
    let result = runner.run(&streams, |(frames, bad_preface)| {
        let (mut input, expected) = encode(&frames);
        let expected = if let Some(preface) = bad_preface {
            input.splice(..24, preface);
            None
        } else {
            expected
        };
        let blocks = frames
            .iter()
            .filter(|f| matches!(f, Frame::Headers { .. }))
            .count();
        let (output, finished) = run_relay(input.clone());
        prop_assert!(finished, "the relay hung on {} bytes", input.len());
        prop_assert!(
            output.len() <= 2 * input.len() + blocks * (80 << 10),
            "{} bytes out of {} in",
            output.len(),
            input.len()
        );
        if let Some(expected) = expected {
            let got = header_blocks(&output);
            prop_assert_eq!(
                got.as_ref(),
                Some(&expected),
                "headers relayed as the model says"
            );
        }
        Ok::<(), TestCaseError>(())
    });
    if let Err(error) = result {
        panic!("fuzz_registration_relay: {error}");
    }
    eprintln!(
        "fuzz_registration_relay: {cases} cases in {:.2?}",
        started.elapsed()
    );
}
