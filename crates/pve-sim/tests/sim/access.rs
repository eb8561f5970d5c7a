//! Authentication: API tokens, tickets with cookie and CSRF token, 401 with an empty body,
//! and the 403 for API tokens on endpoints without `allowtoken` (`POST /access/ticket`).

use crate::{Resp, Sim, TOKEN, sim};

/// `POST /access/ticket` with the given `Authorization` header (or none) and form.
async fn ticket_request(s: &Sim, authorization: Option<&str>, form: &[(&str, &str)]) -> Resp {
    let mut req = s.client.post(s.url("/access/ticket")).form(form);
    if let Some(a) = authorization {
        req = req.header("Authorization", a);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
    Resp { status, body, text }
}

/// Logs in with the password (and no token header, which PVE would refuse).
async fn login(s: &Sim) -> (String, String) {
    let r = ticket_request(
        s,
        None,
        &[("username", "root@pam"), ("password", "proxops")],
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    (
        r.data()["ticket"].as_str().unwrap().to_string(),
        r.data()["CSRFPreventionToken"]
            .as_str()
            .unwrap()
            .to_string(),
    )
}

#[tokio::test]
async fn requests_without_credentials_get_401_with_an_empty_body() {
    let mut s = sim().await;
    s.auth = None;
    let r = s.get("/version").await;
    assert_eq!(r.status, 401);
    assert_eq!(r.text, "");
}

#[tokio::test]
async fn a_wrong_token_secret_gets_401() {
    let mut s = sim().await;
    s.auth = Some("PVEAPIToken=root@pam!proxops=wrong".to_string());
    let r = s.get("/version").await;
    assert_eq!(r.status, 401);
    assert_eq!(r.text, "");
}

#[tokio::test]
async fn the_api_token_works_for_writes_without_csrf() {
    let s = sim().await;
    let r = s.post("/nodes/pve1/qemu", &[("vmid", "100")]).await;
    assert_eq!(r.status, 200, "{r:?}");
}

#[tokio::test]
async fn tickets_work_as_cookie_and_writes_need_the_csrf_token() {
    let mut s = sim().await;
    let (ticket, csrf) = login(&s).await;
    s.auth = None;
    let cookie = format!("PVEAuthCookie={ticket}");
    let get = s
        .client
        .get(s.url("/version"))
        .header("Cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), 200);
    let no_csrf = s
        .client
        .post(s.url("/nodes/pve1/qemu"))
        .header("Cookie", &cookie)
        .form(&[("vmid", "101")])
        .send()
        .await
        .unwrap();
    assert_eq!(no_csrf.status(), 401);
    let with_csrf = s
        .client
        .post(s.url("/nodes/pve1/qemu"))
        .header("Cookie", &cookie)
        .header("CSRFPreventionToken", &csrf)
        .form(&[("vmid", "101")])
        .send()
        .await
        .unwrap();
    assert_eq!(with_csrf.status(), 200);
}

#[tokio::test]
async fn a_wrong_password_gets_401_from_the_ticket_endpoint() {
    let s = sim().await;
    let r = ticket_request(&s, None, &[("username", "root@pam"), ("password", "nope")]).await;
    assert_eq!(r.status, 401);
}

const TOKEN_ON_TICKET: &str = "Permission check failed (URI '/access/ticket' not available \
     with API token, need proper ticket.\n)\n";

#[tokio::test]
async fn an_api_token_on_the_ticket_endpoint_gets_403_although_the_endpoint_needs_no_login() {
    let s = sim().await;
    let r = ticket_request(
        &s,
        Some(TOKEN),
        &[("username", "root@pam"), ("password", "proxops")],
    )
    .await;
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(r.message(), TOKEN_ON_TICKET);
    assert_eq!(r.body["data"], serde_json::Value::Null);
    let log = s.sim.control().requests();
    assert_eq!(log.requests.last().unwrap().status, 403);
}

#[tokio::test]
async fn a_token_header_with_a_wrong_secret_on_the_ticket_endpoint_is_403_not_401() {
    let s = sim().await;
    // No login is needed there, so the token is never verified: its mere presence is refused.
    let r = ticket_request(
        &s,
        Some("PVEAPIToken=root@pam!proxops=wrong"),
        &[("username", "root@pam"), ("password", "proxops")],
    )
    .await;
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(r.message(), TOKEN_ON_TICKET);
}

#[tokio::test]
async fn the_token_check_on_the_ticket_endpoint_comes_before_parameter_validation() {
    let s = sim().await;
    // No username or password, and an unknown parameter: PVE still answers the token 403.
    let r = ticket_request(&s, Some(TOKEN), &[("bogus", "1")]).await;
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(r.message(), TOKEN_ON_TICKET);
    // Without the token the same request fails validation.
    let r = ticket_request(&s, None, &[("bogus", "1")]).await;
    assert_eq!(r.status, 400, "{r:?}");
}

#[tokio::test]
async fn the_handler_lookup_501_comes_before_the_token_check() {
    let s = sim().await;
    // PUT has no handler on the token-refusing path: 501 wins over the token 403.
    let r = s.put("/access/ticket", &[]).await;
    assert_eq!(r.status, 501, "{r:?}");
    assert_eq!(r.message(), "Method 'PUT /access/ticket' not implemented\n");
}

#[tokio::test]
async fn a_ticket_cookie_beside_a_token_header_may_renew_the_ticket() {
    let s = sim().await;
    let (ticket, _csrf) = login(&s).await;
    // With a cookie pveproxy never reads the token header, so this is not a token request.
    let resp = s
        .client
        .post(s.url("/access/ticket"))
        .header("Cookie", format!("PVEAuthCookie={ticket}"))
        .header("Authorization", TOKEN)
        .form(&[("username", "root@pam"), ("password", ticket.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn get_access_ticket_allows_api_tokens() {
    let s = sim().await;
    let r = s.get("/access/ticket").await;
    assert_eq!(r.status, 200, "{r:?}");
}

#[tokio::test]
async fn permissions_list_privileges_by_path() {
    let s = sim().await;
    let r = s.get("/access/permissions").await;
    assert_eq!(r.data()["/"]["VM.Allocate"], 1);
    let one = s.get_q("/access/permissions", &[("path", "/vms")]).await;
    assert_eq!(one.data().as_object().unwrap().len(), 1);
}

#[tokio::test]
async fn permissions_parameters_are_validated_by_the_vendored_schema() {
    let s = sim().await;
    let r = s.get_q("/access/permissions", &[("bogus", "1")]).await;
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(
        r.error("bogus"),
        "property is not defined in schema and the schema does not allow additional properties"
    );
    // A name check alone passed any userid; the schema's `pve-userid` format does not.
    let r = s.get_q("/access/permissions", &[("userid", "root")]).await;
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(r.error("userid"), "value does not match the regex pattern");
    let r = s
        .get_q("/access/permissions", &[("userid", "root@pam")])
        .await;
    assert_eq!(r.status, 200, "{r:?}");
}

#[tokio::test]
async fn the_ticket_cookie_wins_over_a_token_header() {
    let s = sim().await;
    let (ticket, _csrf) = login(&s).await;
    // A valid cookie plus a bad token: the cookie decides, so the GET passes.
    let resp = s
        .client
        .get(s.url("/version"))
        .header("Cookie", format!("PVEAuthCookie={ticket}"))
        .header("Authorization", "PVEAPIToken=root@pam!proxops=wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn requests_are_logged_with_the_caller() {
    let s = sim().await;
    s.get("/version").await;
    let log = s.sim.control().requests();
    let last = log.requests.last().unwrap();
    assert_eq!(last.user.as_deref(), Some("root@pam!proxops"));
    assert_eq!(last.status, 200);
    assert_eq!(last.endpoint, "/version");
}
