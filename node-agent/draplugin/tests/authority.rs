//! The kubelet's plugin watcher sends the registration socket's path as the
//! HTTP/2 `:authority`. These tests speak raw HTTP/2 as it does: tonic alone
//! resets the stream (PROTOCOL_ERROR), and through [`relay`] the same bytes
//! get GetInfo's answer.

use loona_hpack::{Decoder, Encoder};
use prost::Message;
use tessera_draplugin::{
    authority::relay,
    pluginregistration::{
        InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
        registration_server::{Registration, RegistrationServer},
    },
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// As kubelet v1.36.3's grpc-go sends it: the socket path, escaped.
const SOCKET: &str = "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.tessera.dev-reg.sock";

struct Registrar;

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: "DRAPlugin".into(),
            name: "gpu.tessera.dev".into(),
            endpoint: "/var/lib/kubelet/plugins/gpu.tessera.dev/dra.sock".into(),
            supported_versions: vec!["v1.DRAPlugin".into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        _: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// A registration server fed the returned connections.
fn server() -> tokio::sync::mpsc::Sender<std::io::Result<DuplexStream>> {
    let (connections, incoming) = tokio::sync::mpsc::channel(1);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Registrar))
            .serve_with_incoming(ReceiverStream::new(incoming)),
    );
    connections
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut bytes = length[1..].to_vec();
    bytes.extend([kind, flags]);
    bytes.extend(stream.to_be_bytes());
    bytes.extend(payload);
    bytes
}

/// What the server answered to GetInfo: the response's headers and
/// trailers, and its message; or how the stream ended otherwise.
async fn get_info<S: AsyncRead + AsyncWrite + Unpin>(
    mut conn: S,
) -> Result<(Vec<(String, String)>, PluginInfo), String> {
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    let block = Encoder::new().encode([
        (&b":method"[..], &b"POST"[..]),
        (b":scheme", b"http"),
        (b":path", b"/pluginregistration.Registration/GetInfo"),
        (b":authority", SOCKET.as_bytes()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ]);
    out.extend(frame(0x1, 0x4, 1, &block));
    out.extend(frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0]));
    conn.write_all(&out).await.unwrap();

    let mut decoder = Decoder::new();
    let mut headers = Vec::new();
    let mut data = Vec::new();
    loop {
        let mut head = [0u8; 9];
        conn.read_exact(&mut head)
            .await
            .map_err(|e| format!("connection closed: {e}"))?;
        let length = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0u8; length];
        conn.read_exact(&mut payload).await.unwrap();
        let (kind, flags) = (head[3], head[4]);
        match kind {
            0x4 if flags & 0x1 == 0 => conn.write_all(&frame(0x4, 0x1, 0, &[])).await.unwrap(),
            0x3 => {
                let code = u32::from_be_bytes(payload[..4].try_into().unwrap());
                return Err(format!("RST_STREAM {code:#x}"));
            }
            0x0 => data.extend(payload),
            0x1 => {
                for (name, value) in decoder.decode(&payload).unwrap() {
                    headers.push((
                        String::from_utf8(name).unwrap(),
                        String::from_utf8(value).unwrap(),
                    ));
                }
                if flags & 0x1 != 0 {
                    let info = PluginInfo::decode(&data[5..]).unwrap();
                    return Ok((headers, info));
                }
            }
            _ => {}
        }
    }
}

#[tokio::test]
async fn tonic_alone_resets_a_request_whose_authority_is_a_socket_path() {
    let connections = server();
    let (client, server_end) = tokio::io::duplex(64 * 1024);
    connections.send(Ok(server_end)).await.unwrap();
    let answer = get_info(client).await;
    assert_eq!(answer.unwrap_err(), "RST_STREAM 0x1", "PROTOCOL_ERROR");
}

#[tokio::test]
async fn through_the_relay_the_kubelets_request_is_answered() {
    let connections = server();
    let (client, kubelet_end) = tokio::io::duplex(64 * 1024);
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    connections.send(Ok(theirs)).await.unwrap();
    tokio::spawn(relay(kubelet_end, ours));
    let (headers, info) = get_info(client).await.unwrap();
    let value = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(value(":status"), Some("200"));
    assert_eq!(value("grpc-status"), Some("0"), "{headers:?}");
    assert_eq!(info.name, "gpu.tessera.dev");
    assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);
}

#[tokio::test]
async fn a_header_block_that_decodes_to_too_much_ends_the_connection() {
    let connections = server();
    let (mut client, kubelet_end) = tokio::io::duplex(1 << 20);
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    connections.send(Ok(theirs)).await.unwrap();
    let relay = tokio::spawn(relay(kubelet_end, ours));
    // One 4000-byte header added to the table, then 200 references to it
    // (one byte each): 800 kB decoded from about 4 kB.
    let mut block = Encoder::new().encode([(&b"x-big"[..], &[b'a'; 4000][..])]);
    block[0] = 0x40 | (block[0] & 0x3f); // literal with incremental indexing
    block.extend(std::iter::repeat_n(0xbe, 200)); // index 62: the new entry
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    out.extend(frame(0x1, 0x4, 1, &block));
    client.write_all(&out).await.unwrap();
    let ended = tokio::time::timeout(std::time::Duration::from_secs(5), relay)
        .await
        .expect("the relay gives up at once")
        .unwrap();
    assert!(ended.unwrap_err().to_string().contains("too large"));
}
