//! The worker protocol held in one place: the committed schema is the one
//! the message types generate (`schemas/worker-protocol.schema.json`), and
//! both workers pass one committed transcript of requests and the shape of
//! their answers (`tests/fixtures/protocol/transcript.json`), every request
//! and answer validated against that schema. A change to a message fails
//! here: in the schema, in the transcript, or in the worker that does not
//! follow it.
//!
//! The Python worker runs as a lane in Triton's interpreter and needs a
//! Python with torch and Triton, named by TUNELAB_TEST_PYTHON (`just test`
//! sets it; without it its half says so and passes vacuously, as
//! tests/run_interpreter.rs does). The native worker runs with no GPU
//! shown to it: it still reads every request and refuses a bad one, and
//! answers a good one with `problem_error` (its GPU paths run in
//! bench/native_gpu_check.sh).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value as Json};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn schema() -> Json {
    let text = std::fs::read_to_string(repo().join("schemas/worker-protocol.schema.json"))
        .expect("schemas/worker-protocol.schema.json");
    serde_json::from_str(&text).expect("the schema is JSON")
}

fn transcript() -> Vec<Json> {
    let text = std::fs::read_to_string(repo().join("tests/fixtures/protocol/transcript.json"))
        .expect("the transcript");
    let doc: Json = serde_json::from_str(&text).expect("the transcript is JSON");
    doc["steps"].as_array().expect("steps").clone()
}

#[test]
fn committed_schema_is_current() {
    let on_disk = std::fs::read_to_string(repo().join("schemas/worker-protocol.schema.json"))
        .unwrap_or_default();
    assert!(
        on_disk == tunelab::protocol::json_schema(),
        "schemas/worker-protocol.schema.json is stale: run `just schemas` \
         (or `tunelab schema --worker-protocol > schemas/worker-protocol.schema.json`)"
    );
}

#[test]
fn the_transcript_expects_the_protocol_this_build_speaks() {
    let hello = transcript()
        .into_iter()
        .find(|s| s["request"]["op"] == "hello")
        .expect("a hello");
    assert_eq!(
        hello["python"]["has"]["protocol"],
        json!(tunelab::protocol::python::VERSION),
        "the transcript's hello expects another Python worker protocol than this build's"
    );
}

/// A worker process speaking JSON lines on its stdin and stdout.
struct Peer {
    child: Child,
    answers: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Peer {
    fn start(mut cmd: Command) -> Peer {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the worker starts");
        let answers = BufReader::new(child.stdout.take().unwrap()).lines();
        Peer { child, answers }
    }

    fn ask(&mut self, line: &str) -> Json {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
        let answer = self.answers.next().expect("an answer").unwrap();
        serde_json::from_str(&answer).unwrap_or_else(|e| panic!("not JSON ({e}): {answer}"))
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// The transcript's steps that `worker` has an expectation for, each sent
/// to it in order and its answer checked.
fn run_transcript(worker: &str, mut peer: Peer, cache: &Path) {
    let schema = schema();
    let cache = cache.display().to_string();
    let mut served = std::collections::BTreeSet::new();
    for (n, step) in transcript().iter().enumerate() {
        let Some(expect) = step.get(worker) else {
            continue;
        };
        let (line, request) = match (step.get("line"), step.get("request")) {
            (Some(line), None) => (line.as_str().expect("a line").to_string(), None),
            (None, Some(request)) => {
                let mut request = request.clone();
                if request.get("id").is_none() {
                    request["id"] = json!(n + 1);
                }
                let text = request.to_string().replace("CACHE", &cache);
                (
                    text.clone(),
                    Some(serde_json::from_str::<Json>(&text).unwrap()),
                )
            }
            _ => panic!("step {}: a request or a line", n + 1),
        };
        let at = format!("{worker}, step {} ({line})", n + 1);
        if let Some(request) = &request {
            let op = request["op"].as_str().unwrap_or("");
            let definition = format!("{worker}.{op}.request");
            let fits = schema["definitions"].get(&definition).is_some()
                && validate(
                    &schema,
                    &json!({"$ref": format!("#/definitions/{definition}")}),
                    request,
                )
                .is_ok();
            if step.get("schema").and_then(Json::as_str) == Some("refuses") {
                assert!(!fits, "{at}: the schema should refuse this request");
            } else {
                assert!(
                    fits,
                    "{at}: the request does not fit {definition}: {:?}",
                    validate(
                        &schema,
                        &json!({"$ref": format!("#/definitions/{definition}")}),
                        request
                    )
                );
                served.insert(op.to_string());
            }
        }
        let answer = peer.ask(&line);
        if expect.get("ok") == Some(&json!(true)) {
            assert_eq!(answer["ok"], true, "{at}: {answer}");
            let op = request.as_ref().expect("an ok answer is to a request")["op"]
                .as_str()
                .unwrap();
            let definition = format!("#/definitions/{worker}.{op}.answer");
            if let Err(e) = validate(&schema, &json!({"$ref": definition}), &answer) {
                panic!("{at}: the answer does not fit {definition}: {e}\n{answer}");
            }
            for (path, value) in expect
                .get("has")
                .and_then(Json::as_object)
                .into_iter()
                .flatten()
            {
                let got = path
                    .split('.')
                    .try_fold(&answer, |v, key| match key.parse::<usize>() {
                        Ok(i) => v.get(i),
                        Err(_) => v.get(key),
                    });
                assert_eq!(got, Some(value), "{at}: `{path}` in {answer}");
            }
        } else {
            let class = expect["class"]
                .as_str()
                .expect("an expectation: ok or a class");
            assert_eq!(answer["ok"], false, "{at}: {answer}");
            assert_eq!(answer["class"], class, "{at}: {answer}");
            if let Err(e) = validate(&schema, &json!({"$ref": "#/definitions/failure"}), &answer) {
                panic!("{at}: the failure does not fit `failure`: {e}\n{answer}");
            }
            let id = request
                .as_ref()
                .and_then(|r| r.get("id"))
                .filter(|id| id.is_u64());
            assert_eq!(
                answer["id"],
                id.cloned().unwrap_or(Json::Null),
                "{at}: {answer}"
            );
        }
    }
    // Every op the schema says the worker serves was asked of it.
    let ops: std::collections::BTreeSet<String> = schema["definitions"]
        .as_object()
        .unwrap()
        .keys()
        .filter_map(|k| k.strip_prefix(&format!("{worker}.")))
        .filter_map(|k| k.strip_suffix(".request"))
        .map(str::to_string)
        .collect();
    let missing: Vec<&String> = ops.difference(&served).collect();
    assert!(
        missing.is_empty(),
        "{worker}: the transcript sends no {missing:?}"
    );
}

#[test]
fn the_native_worker_follows_the_transcript() {
    let cache = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tunelab"));
    // No GPU, on any machine: its answers are those of a worker without one.
    cmd.args(["native-worker", "--backend", "cuda"])
        .env("CUDA_VISIBLE_DEVICES", "")
        .env("TUNELAB_SPIN_US", "0");
    run_transcript("native", Peer::start(cmd), cache.path());
}

#[test]
fn the_python_worker_follows_the_transcript() {
    let python: PathBuf = match std::env::var("TUNELAB_TEST_PYTHON") {
        Ok(p) if !p.is_empty() => p.into(),
        _ => {
            eprintln!("TUNELAB_TEST_PYTHON is not set: skipping the Python worker's transcript (run `just test`)");
            return;
        }
    };
    let cache = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(python);
    cmd.args(["-u", "-m", "tunelab.worker", "--role", "lane"])
        .env("PYTHONPATH", repo().join("python"))
        .env("TRITON_INTERPRET", "1")
        .env("TRITON_CACHE_DIR", cache.path().join("triton"))
        .env("TUNELAB_SPIN_US", "0");
    run_transcript("python", Peer::start(cmd), cache.path());
}

/// Whether `value` fits `schema` (a JSON schema, draft 7), resolving
/// `$ref`s in `root`. Only the keywords the generated schema uses are
/// known; any other is an error, so that a schema this cannot judge never
/// passes for one it judged.
fn validate(root: &Json, schema: &Json, value: &Json) -> Result<(), String> {
    let schema = match schema {
        Json::Bool(true) => return Ok(()),
        Json::Bool(false) => return Err("nothing fits `false`".into()),
        Json::Object(s) => s,
        other => return Err(format!("not a schema: {other}")),
    };
    for (keyword, arg) in schema {
        match keyword.as_str() {
            // Annotations.
            "description" | "default" | "format" | "title" | "$schema" | "definitions" => {}
            "$ref" => {
                let name = arg
                    .as_str()
                    .and_then(|r| r.strip_prefix("#/definitions/"))
                    .ok_or_else(|| format!("a $ref this cannot follow: {arg}"))?;
                let target = root["definitions"]
                    .get(name)
                    .ok_or_else(|| format!("no definition {name}"))?;
                validate(root, target, value).map_err(|e| format!("{name}: {e}"))?;
            }
            "allOf" => {
                for s in arg.as_array().ok_or("allOf")? {
                    validate(root, s, value)?;
                }
            }
            "anyOf" => {
                let all = arg.as_array().ok_or("anyOf")?;
                if !all.iter().any(|s| validate(root, s, value).is_ok()) {
                    return Err(format!("{value} fits none of anyOf"));
                }
            }
            "oneOf" => {
                let all = arg.as_array().ok_or("oneOf")?;
                let fits = all
                    .iter()
                    .filter(|s| validate(root, s, value).is_ok())
                    .count();
                if fits != 1 {
                    return Err(format!("{value} fits {fits} of oneOf, not one"));
                }
            }
            "type" => {
                let types: Vec<&str> = match arg {
                    Json::String(t) => vec![t.as_str()],
                    Json::Array(ts) => ts.iter().filter_map(Json::as_str).collect(),
                    _ => return Err(format!("type {arg}")),
                };
                if !types.iter().any(|t| is_type(value, t)) {
                    return Err(format!("{value} is not of type {arg}"));
                }
            }
            "enum" => {
                if !arg.as_array().ok_or("enum")?.contains(value) {
                    return Err(format!("{value} is not one of {arg}"));
                }
            }
            "const" => {
                if arg != value {
                    return Err(format!("{value} is not {arg}"));
                }
            }
            "minimum" | "maximum" => {
                if let (Some(v), Some(bound)) = (value.as_f64(), arg.as_f64()) {
                    let within = if keyword == "minimum" {
                        v >= bound
                    } else {
                        v <= bound
                    };
                    if !within {
                        return Err(format!("{value} is past its {keyword} {bound}"));
                    }
                }
            }
            "minItems" | "maxItems" => {
                if let (Some(items), Some(bound)) = (value.as_array(), arg.as_u64()) {
                    let n = items.len() as u64;
                    let within = if keyword == "minItems" {
                        n >= bound
                    } else {
                        n <= bound
                    };
                    if !within {
                        return Err(format!("{n} items is past its {keyword} {bound}"));
                    }
                }
            }
            "required" => {
                if let Some(object) = value.as_object() {
                    for key in arg.as_array().ok_or("required")? {
                        let key = key.as_str().ok_or("required")?;
                        if !object.contains_key(key) {
                            return Err(format!("`{key}` is missing"));
                        }
                    }
                }
            }
            "properties" => {
                if let Some(object) = value.as_object() {
                    for (key, s) in arg.as_object().ok_or("properties")? {
                        if let Some(v) = object.get(key) {
                            validate(root, s, v).map_err(|e| format!("`{key}`: {e}"))?;
                        }
                    }
                }
            }
            "additionalProperties" => {
                if let Some(object) = value.as_object() {
                    let known = schema.get("properties").and_then(Json::as_object);
                    for (key, v) in object {
                        if !known.is_some_and(|k| k.contains_key(key)) {
                            validate(root, arg, v).map_err(|e| format!("`{key}`: {e}"))?;
                        }
                    }
                }
            }
            "items" => {
                if let Some(items) = value.as_array() {
                    for (i, v) in items.iter().enumerate() {
                        validate(root, arg, v).map_err(|e| format!("[{i}]: {e}"))?;
                    }
                }
            }
            other => return Err(format!("a keyword this cannot judge: {other}")),
        }
    }
    Ok(())
}

fn is_type(value: &Json, t: &str) -> bool {
    match t {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "string" => value.is_string(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        "number" => value.is_number(),
        "integer" => {
            value.is_i64() || value.is_u64() || value.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        _ => false,
    }
}

#[test]
fn the_validator_refuses_what_it_should() {
    let root = json!({"definitions": {"Pair": {
        "type": "object", "required": ["a"], "additionalProperties": false,
        "properties": {"a": {"type": "integer", "minimum": 1, "maximum": 3},
                       "b": {"anyOf": [{"enum": ["x", "y"]}, {"type": "null"}]}}}}});
    let pair = json!({"$ref": "#/definitions/Pair"});
    assert!(validate(&root, &pair, &json!({"a": 2, "b": "x"})).is_ok());
    assert!(validate(&root, &pair, &json!({"a": 2, "b": null})).is_ok());
    for bad in [
        json!({"b": "x"}),
        json!({"a": 0}),
        json!({"a": 4}),
        json!({"a": 1.5}),
        json!({"a": 2, "b": "z"}),
        json!({"a": 2, "c": 1}),
        json!([1]),
    ] {
        assert!(validate(&root, &pair, &bad).is_err(), "{bad}");
    }
    let two = json!({"type": "array", "minItems": 2, "maxItems": 3});
    assert!(validate(&root, &two, &json!([1, 2])).is_ok());
    assert!(validate(&root, &two, &json!([1])).is_err());
    assert!(validate(&root, &two, &json!([1, 2, 3, 4])).is_err());
    let one = json!({"oneOf": [{"required": ["a"]}, {"required": ["b"]}]});
    assert!(validate(&root, &one, &json!({"a": 1})).is_ok());
    assert!(validate(&root, &one, &json!({"a": 1, "b": 2})).is_err());
    assert!(
        validate(&root, &json!({"pattern": "x"}), &json!("x")).is_err(),
        "an unknown keyword"
    );
}
