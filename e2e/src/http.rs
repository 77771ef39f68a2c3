//! A minimal HTTP/1.0 GET for plain-HTTP endpoints (readiness, `/metrics`).

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An answer: its status code and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code, 0 when the status line is not HTTP's.
    pub status: u16,
    /// Everything after the headers.
    pub body: String,
}

/// `GET http://<addr><path>`, read to the end.
pub async fn get(addr: &str, path: &str) -> std::io::Result<Response> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("HTTP/1."))
        .and_then(|rest| rest.get(2..5))
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    Ok(Response {
        status,
        body: body.to_owned(),
    })
}

/// The body of `GET http://<addr><path>`, or an error naming the URL and
/// what went wrong (no answer, or a status other than 200).
pub async fn get_body(addr: &str, path: &str) -> Result<String, String> {
    match get(addr, path).await {
        Ok(Response { status: 200, body }) => Ok(body),
        Ok(Response { status, body }) => {
            Err(format!("GET http://{addr}{path}: status {status}: {body}"))
        }
        Err(error) => Err(format!("GET http://{addr}{path}: {error}")),
    }
}

/// Percent-encodes a query parameter.
pub(crate) fn encode(text: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// Polls `GET http://<addr><path>` every 300 ms until it answers 200;
/// false if it has not within `within`.
pub(crate) async fn wait_ok(addr: &str, path: &str, within: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    while !get_ok(addr, path).await {
        if std::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    true
}

/// Whether `GET http://<addr><path>` answers 200 within 2 s.
pub(crate) async fn get_ok(addr: &str, path: &str) -> bool {
    tokio::time::timeout(std::time::Duration::from_secs(2), get(addr, path))
        .await
        .is_ok_and(|r| r.is_ok_and(|r| r.status == 200))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn status_and_body_are_split() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            for answer in [
                "HTTP/1.1 200 OK\r\nA: b\r\n\r\nhello\n",
                "HTTP/1.0 503 No\r\n\r\nbusy",
            ] {
                let (mut stream, _) = listener.accept().await.unwrap();
                let mut request = [0; 512];
                let _ = stream.read(&mut request).await.unwrap();
                stream.write_all(answer.as_bytes()).await.unwrap();
            }
        });
        assert_eq!(get_body(&addr, "/metrics").await.unwrap(), "hello\n");
        let error = get_body(&addr, "/metrics").await.unwrap_err();
        assert_eq!(
            error,
            format!("GET http://{addr}/metrics: status 503: busy")
        );
    }
}
