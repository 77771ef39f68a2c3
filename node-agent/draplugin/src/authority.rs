//! A relay that lets the kubelet's plugin watcher talk to a tonic server.
//!
//! The kubelet (v1.36) dials a registration socket with its bare path as the
//! gRPC target, so grpc-go sends that path, percent-escaped
//! (`%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fx.sock`), as the HTTP/2
//! `:authority`. The `http` crate does not take that as an authority, and
//! the `h2` crate under tonic answers such a request with RST_STREAM
//! PROTOCOL_ERROR: the registration never happens
//! (kubernetes/kubernetes#108254 fixed other kubelet clients with
//! `WithAuthority("localhost")`, not this one). Go servers accept it.
//!
//! [`relay`] sits between the kubelet's connection and the server: frames
//! from the kubelet pass unchanged except header blocks, which are decoded
//! (HPACK, with the connection's dynamic table), given `:authority:
//! localhost` when theirs is not a valid authority, and encoded again; the
//! server's frames go back untouched.

use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The smallest SETTINGS_MAX_FRAME_SIZE, which every peer accepts.
const MAX_FRAME: usize = 16_384;
/// The largest header block the relay collects (the kubelet's are a few
/// hundred bytes); a larger one ends the connection.
const MAX_BLOCK: usize = 1 << 20;
/// The most a header block may decode to: a small block of references to a
/// large table entry would otherwise decode to gigabytes.
const MAX_DECODED: usize = 64 << 10;
/// The HPACK table size the server side (h2) announces by default.
const TABLE_SIZE: usize = 4096;

/// Relays one HTTP/2 connection from `client` to `server` until either
/// side closes it.
pub async fn relay<C, S>(client: C, server: S) -> std::io::Result<()>
where
    C: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut server_read, mut server_write) = tokio::io::split(server);
    let upstream = rewrite(&mut client_read, &mut server_write);
    let downstream = async {
        tokio::io::copy(&mut server_read, &mut client_write).await?;
        client_write.shutdown().await
    };
    tokio::select! {
        done = upstream => done,
        done = downstream => done,
    }
}

fn invalid(message: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, message.to_owned())
}

async fn rewrite<R, W>(from: &mut R, to: &mut W) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; 24];
    from.read_exact(&mut preface).await?;
    if &preface != PREFACE {
        return Err(invalid("not an HTTP/2 connection preface"));
    }
    to.write_all(&preface).await?;
    let mut decoder = Decoder::new();
    decoder.set_max_allowed_table_size(TABLE_SIZE);
    let mut encoder = Encoder::new();
    // A header block being collected: stream, END_STREAM, fragments.
    let mut block: Option<(u32, u8, Vec<u8>)> = None;
    loop {
        let mut head = [0u8; 9];
        match from.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let length = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; length];
        from.read_exact(&mut payload).await?;
        match kind {
            HEADERS => {
                if block.is_some() {
                    return Err(invalid("HEADERS inside a header block"));
                }
                let fragment = header_fragment(flags, &payload)?;
                block = Some((stream, flags & END_STREAM, fragment.to_vec()));
            }
            CONTINUATION => match block.as_mut() {
                Some((s, _, collected)) if *s == stream => collected.extend_from_slice(&payload),
                _ => return Err(invalid("CONTINUATION without HEADERS")),
            },
            _ => {
                if block.is_some() {
                    return Err(invalid("a frame inside a header block"));
                }
                to.write_all(&head).await?;
                to.write_all(&payload).await?;
                continue;
            }
        }
        if block.as_ref().is_some_and(|(_, _, b)| b.len() > MAX_BLOCK) {
            return Err(invalid("header block too large"));
        }
        if flags & END_HEADERS == 0 {
            continue;
        }
        let Some((stream, end_stream, fragments)) = block.take() else {
            continue;
        };
        let mut headers: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut decoded = 0usize;
        decoder
            .decode_with_cb(&fragments, |name, value| {
                decoded += name.len() + value.len();
                if decoded <= MAX_DECODED {
                    headers.push((name.into_owned(), value.into_owned()));
                }
            })
            .map_err(|e| invalid(&format!("HPACK: {e:?}")))?;
        if decoded > MAX_DECODED {
            return Err(invalid("header block decodes too large"));
        }
        let encoded = encoder.encode(
            headers
                .iter()
                .map(|(name, value)| (name.as_slice(), authority(name, value))),
        );
        write_block(to, stream, end_stream, &encoded).await?;
    }
}

/// `value`, unless it is an `:authority` that `h2` would refuse (as the
/// `http` crate under it parses it).
fn authority<'a>(name: &[u8], value: &'a [u8]) -> &'a [u8] {
    if name == b":authority" && http::uri::Authority::try_from(value).is_err() {
        b"localhost"
    } else {
        value
    }
}

/// The header block fragment of a HEADERS frame's payload, without its
/// padding and priority fields.
fn header_fragment(flags: u8, payload: &[u8]) -> std::io::Result<&[u8]> {
    let mut start = 0;
    let mut end = payload.len();
    if flags & PADDED != 0 {
        let pad = usize::from(
            *payload
                .first()
                .ok_or_else(|| invalid("empty padded HEADERS"))?,
        );
        start = 1;
        end = end
            .checked_sub(pad)
            .ok_or_else(|| invalid("padding longer than the frame"))?;
    }
    if flags & PRIORITY != 0 {
        start += 5;
    }
    payload
        .get(start..end)
        .ok_or_else(|| invalid("HEADERS shorter than its fields"))
}

/// Writes a header block as one HEADERS frame and as many CONTINUATIONs as
/// it needs.
async fn write_block<W: AsyncWrite + Unpin>(
    to: &mut W,
    stream: u32,
    end_stream: u8,
    block: &[u8],
) -> std::io::Result<()> {
    let chunks: Vec<&[u8]> = if block.is_empty() {
        vec![block]
    } else {
        block.chunks(MAX_FRAME).collect()
    };
    for (i, chunk) in chunks.iter().enumerate() {
        let kind = if i == 0 { HEADERS } else { CONTINUATION };
        let mut flags = if i == 0 { end_stream } else { 0 };
        if i + 1 == chunks.len() {
            flags |= END_HEADERS;
        }
        let length = chunk.len().to_be_bytes();
        let mut head = [0u8; 9];
        head[..3].copy_from_slice(&length[length.len() - 3..]);
        head[3] = kind;
        head[4] = flags;
        head[5..].copy_from_slice(&stream.to_be_bytes());
        to.write_all(&head).await?;
        to.write_all(chunk).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_no_authority_and_is_replaced() {
        assert_eq!(
            authority(b":authority", b"/var/lib/kubelet/plugins_registry/x.sock"),
            b"localhost"
        );
        assert_eq!(
            authority(b":authority", b"localhost:50051"),
            b"localhost:50051"
        );
        // grpc-go escapes the path in some versions; h2 refuses that too.
        assert_eq!(
            authority(b":authority", b"%2Fvar%2Flib%2Fx.sock"),
            b"localhost"
        );
        assert_eq!(authority(b":path", b"/a/b"), b"/a/b");
    }

    #[test]
    fn padding_and_priority_are_not_part_of_the_block() {
        let padded = [2, b'a', b'b', 0, 0];
        assert_eq!(header_fragment(PADDED, &padded).unwrap(), b"ab");
        let prioritised = [0, 0, 0, 1, 16, b'x'];
        assert_eq!(header_fragment(PRIORITY, &prioritised).unwrap(), b"x");
        assert!(header_fragment(PADDED, &[9, b'a']).is_err());
    }
}
