//! Bind's last look at the node agent: `GET /readyz` on its pod.
//!
//! The watch of agent pods learns that an agent died when its kubelet
//! reports it, up to a PLEG relist (about a second) later. A pod bound in
//! that window reaches a kubelet whose device plugin is gone and is rejected
//! for good (`UnexpectedAdmissionError`). Asking the agent itself just before
//! the binding closes the window to the time between this answer and the
//! kubelet's admission: a dead agent refuses the connection at once.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long the agent has to answer.
const TIMEOUT: Duration = Duration::from_millis(500);
/// The most of the answer read: its status line is all that matters.
const READ_LIMIT: u64 = 1024;

/// `Ok` when the agent at `endpoint` (`ip:port`) answers `/readyz` with 200
/// within [`TIMEOUT`]; otherwise why not, for the pod's event.
pub async fn agent_ready(endpoint: &str) -> Result<(), String> {
    match tokio::time::timeout(TIMEOUT, readyz(endpoint)).await {
        Ok(Ok(200)) => Ok(()),
        Ok(Ok(status)) => Err(format!(
            "the node agent at {endpoint} answers /readyz with {status} (its device plugin is not registered with the kubelet)"
        )),
        Ok(Err(error)) => Err(format!(
            "the node agent at {endpoint} does not answer: {error}"
        )),
        Err(_) => Err(format!(
            "the node agent at {endpoint} did not answer /readyz within {} ms",
            TIMEOUT.as_millis()
        )),
    }
}

async fn readyz(endpoint: &str) -> std::io::Result<u16> {
    Ok(get(endpoint, "/readyz", READ_LIMIT).await?.0)
}

/// `GET http://<endpoint><path>` over plain HTTP/1.0 (the agent's
/// `/readyz` and `/metrics`), reading at most `limit` bytes of the answer:
/// its status code (0 when the status line is not HTTP's) and what follows
/// the headers.
pub async fn get(endpoint: &str, path: &str, limit: u64) -> std::io::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(endpoint).await?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {endpoint}\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    stream.take(limit).read_to_end(&mut answer).await?;
    let answer = String::from_utf8_lossy(&answer);
    // "HTTP/1.1 200 OK"
    let status = answer
        .get(9..12)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    Ok((status, body.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn serve(answer: &'static str) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = [0; 256];
            let _ = stream.read(&mut request).await.unwrap();
            if !answer.is_empty() {
                stream.write_all(answer.as_bytes()).await.unwrap();
            } else {
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        });
        endpoint
    }

    #[tokio::test]
    async fn only_a_200_within_the_timeout_lets_the_pod_through() {
        let ready = serve("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
        assert_eq!(agent_ready(&ready).await, Ok(()));

        let unregistered = serve("HTTP/1.1 503 Service Unavailable\r\n\r\nnot registered").await;
        let error = agent_ready(&unregistered).await.unwrap_err();
        assert!(error.contains("answers /readyz with 503"), "{error}");

        let silent = serve("").await;
        let error = agent_ready(&silent).await.unwrap_err();
        assert!(
            error.contains("did not answer /readyz within 500 ms"),
            "{error}"
        );

        // Nothing listens: a dead agent.
        let gone = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().to_string()
        };
        let error = agent_ready(&gone).await.unwrap_err();
        assert!(error.contains("does not answer"), "{error}");
    }
}
