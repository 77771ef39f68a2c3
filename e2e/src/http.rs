//! A minimal HTTP/1.0 GET for readiness checks of plain-HTTP endpoints.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Whether `GET http://<addr><path>` answers 200 within 2 s.
pub(crate) async fn get_ok(addr: &str, path: &str) -> bool {
    tokio::time::timeout(std::time::Duration::from_secs(2), get(addr, path))
        .await
        .unwrap_or(false)
}

async fn get(addr: &str, path: &str) -> bool {
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return false;
    };
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response).await;
    response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200")
}
