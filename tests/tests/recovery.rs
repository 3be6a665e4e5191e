//! What a run leaves behind when it ends or loses its worker mid-way is
//! repaired before the conversation goes on: tool calls without results are
//! answered before anything else joins the conversation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kiln_scripted_model::Reply;
use kiln_tests::{Ev, Options, TestApp, kinds, token};
use serde_json::{Value, json};
use uuid::Uuid;

async fn post(app: &TestApp, path: &str, body: Value) -> (u16, Value) {
    let r = app.http.post(app.url(path)).bearer_auth(token("alice")).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn until(app: &TestApp, id: &str, after: Option<i64>, stop: impl Fn(&Ev) -> bool) -> Vec<Ev> {
    let evs = app.sse_until(app.addr, "alice", id, after, usize::MAX, &stop).await;
    assert!(evs.last().is_some_and(stop), "{:?}", kinds(&evs));
    evs
}

#[tokio::test]
async fn a_follow_up_to_a_run_cancelled_mid_call_answers_the_call_before_its_prompt() {
    let app = TestApp::spawn(Options {
        script: vec![Reply::tool("bash", json!({"command": "sleep 30; echo never"})), Reply::text("follow-up done")],
        ..Default::default()
    })
    .await;
    let run = app.create_run("alice", json!({"prompt": "start"})).await;
    let id = run["id"].as_str().unwrap();
    let ready = until(&app, id, None, |e| e.kind == "tool_call.ready").await;
    let call = ready.last().unwrap().data["call_id"].as_str().unwrap().to_owned();
    let (status, _) = post(&app, &format!("/v1/runs/{id}/cancel"), json!({})).await;
    assert!(status == 200 || status == 202, "cancel: {status}");
    until(&app, id, None, |e| e.kind == "run.cancelled").await;

    let (status, body) = post(&app, &format!("/v1/runs/{id}/messages"), json!({"text": "what happened?"})).await;
    assert_eq!(status, 201, "{body}");
    let follow = body["run"]["id"].as_str().unwrap().to_owned();
    let events = app.events_to_end("alice", &follow).await;
    assert_eq!(events.last().unwrap().kind, "run.succeeded", "{:?}", kinds(&events));

    // What the model was sent for the follow-up: the call, its answer, then
    // the new prompt; nothing between the call and its answer.
    let requests = app.model.requests();
    assert_eq!(requests.len(), 2);
    let messages = requests[1].body["messages"].as_array().unwrap();
    let at = |pred: &dyn Fn(&Value) -> bool| messages.iter().position(pred).unwrap_or(usize::MAX);
    let asked = at(&|m| m["role"] == "assistant" && m["tool_calls"][0]["id"] == call.as_str());
    let answered = at(&|m| m["role"] == "tool" && m["tool_call_id"] == call.as_str());
    let prompt = at(&|m| m["role"] == "user" && m["content"] == "what happened?");
    assert!(asked < messages.len() && answered == asked + 1 && prompt == answered + 1, "{messages:#?}");
    let answer = messages[answered]["content"].as_str().unwrap();
    assert!(answer.starts_with("interrupted: the run ended"), "{answer}");

    // The follow-up says so in its events, in the tool message's commit.
    let result = events.iter().find(|e| e.kind == "tool.result").expect("tool.result");
    assert_eq!(result.data["call_id"], call.as_str());
    let sql = app.sql().await;
    let follow: Uuid = follow.parse().unwrap();
    let event_tx: i64 = sql
        .query_one("SELECT xmin::text::bigint FROM events WHERE run_id = $1 AND kind = 'tool.result'", &[&follow])
        .await
        .unwrap()
        .get(0);
    let message_tx: i64 = sql
        .query_one("SELECT xmin::text::bigint FROM messages WHERE run_id = $1 AND role = 'tool'", &[&follow])
        .await
        .unwrap()
        .get(0);
    assert_eq!(event_tx, message_tx);
}
