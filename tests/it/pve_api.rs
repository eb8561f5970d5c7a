//! PVE's API as an operator (or a test's set-up) calls it: straight HTTP to the simulator with
//! the world's token, outside ProxOps' own client, so what ProxOps did is read back
//! independently. Test modules add their own methods in `impl Api` blocks of their own.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::sim::World;

/// The simulator's API with the default token (`root@pam!proxops`).
pub(crate) struct Api {
    pub(crate) base: String,
    pub(crate) http: reqwest::Client,
}

impl Api {
    pub(crate) fn new(world: &World) -> Api {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Api {
            base: world.sim.base_url(),
            // The simulator's certificate is self-signed; these calls only set up and read back.
            http: reqwest::Client::builder()
                .danger_accept_invalid_certs(true)
                .build()
                .unwrap(),
        }
    }

    /// One call; asserts success and returns `data`.
    pub(crate) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        form: &[(&str, &str)],
    ) -> Value {
        let response = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header(
                "Authorization",
                "PVEAPIToken=root@pam!proxops=proxops-dev-secret",
            )
            .form(form)
            .send()
            .await
            .unwrap();
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        assert!(status.is_success(), "{path}: {status} {body}");
        body["data"].clone()
    }

    pub(crate) async fn get(&self, path: &str) -> Value {
        self.call(reqwest::Method::GET, path, &[]).await
    }

    pub(crate) async fn put(&self, path: &str, form: &[(&str, &str)]) -> Value {
        self.call(reqwest::Method::PUT, path, form).await
    }

    pub(crate) async fn post(&self, path: &str, form: &[(&str, &str)]) -> Value {
        self.call(reqwest::Method::POST, path, form).await
    }

    /// A guest's config as text values (numbers as their decimal text).
    pub(crate) async fn config(
        &self,
        node: &str,
        kind: &str,
        vmid: u32,
    ) -> serde_json::Map<String, Value> {
        let data = self
            .get(&format!("/nodes/{node}/{kind}/{vmid}/config"))
            .await;
        data.as_object().cloned().unwrap_or_default()
    }

    /// Waits (up to 20 s) for a task to end, and asserts it ended `OK`.
    pub(crate) async fn wait(&self, node: &str, upid: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let status = self
                .get(&format!("/nodes/{node}/tasks/{upid}/status"))
                .await;
            if status["status"] == "stopped" {
                assert_eq!(status["exitstatus"], "OK", "{upid}: {status}");
                return;
            }
            assert!(Instant::now() < deadline, "task {upid} did not end");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// POSTs and, when PVE answers with a task, waits for it to end OK.
    pub(crate) async fn post_and_wait(&self, node: &str, path: &str, form: &[(&str, &str)]) {
        if let Some(upid) = self.post(path, form).await.as_str() {
            self.wait(node, upid).await;
        }
    }
}
