use super::*;

fn check(json: &str) -> Result<Checked, ApiError> {
    serde_json::from_str::<Sampling>(json)
        .unwrap()
        .check(7, Endpoint::Chat, 1000)
}

fn check_completions(json: &str) -> Result<Checked, ApiError> {
    serde_json::from_str::<Sampling>(json)
        .unwrap()
        .check(7, Endpoint::Completions, 1000)
}

#[test]
fn defaults_are_the_clis() {
    let c = check("{}").unwrap();
    assert_eq!(
        c.sampler,
        SamplerOptions {
            seed: 7,
            ..SamplerOptions::default()
        }
    );
    assert_eq!(c.max_tokens, None);
    assert!(!c.stream);
}

#[test]
fn out_of_range_values_name_their_field() {
    for (json, param) in [
        (r#"{"max_tokens": 0}"#, "max_tokens"),
        (r#"{"max_tokens": -5}"#, "max_tokens"),
        (r#"{"max_completion_tokens": 0}"#, "max_completion_tokens"),
        (r#"{"temperature": -0.1}"#, "temperature"),
        (r#"{"temperature": 2.5}"#, "temperature"),
        (r#"{"top_p": 1.5}"#, "top_p"),
        (r#"{"min_p": -1}"#, "min_p"),
        (r#"{"top_k": -1}"#, "top_k"),
        (r#"{"repeat_penalty": 0}"#, "repeat_penalty"),
        (r#"{"n": 0}"#, "n"),
        (r#"{"n": 17}"#, "n"),
        (r#"{"presence_penalty": 2.5}"#, "presence_penalty"),
        (r#"{"frequency_penalty": -2.1}"#, "frequency_penalty"),
        (r#"{"repeat_last_n": -2}"#, "repeat_last_n"),
        (r#"{"logit_bias": {"5": 101}}"#, "logit_bias"),
        (r#"{"logit_bias": {"1000": 1}}"#, "logit_bias"),
        (r#"{"logit_bias": {"x": 1}}"#, "logit_bias"),
        (r#"{"logprobs": 3}"#, "logprobs"),
        (r#"{"logprobs": true, "top_logprobs": 21}"#, "top_logprobs"),
        (r#"{"top_logprobs": 2}"#, "top_logprobs"),
        (r#"{"echo": true}"#, "echo"),
    ] {
        let e = check(json).unwrap_err();
        assert_eq!(e.status, 400, "{json}");
        assert_eq!(e.param, Some(param), "{json}");
    }
    for (json, param) in [
        (r#"{"logprobs": 6}"#, "logprobs"),
        (r#"{"logprobs": -1}"#, "logprobs"),
        (r#"{"logprobs": true}"#, "logprobs"),
        (r#"{"top_logprobs": 2}"#, "top_logprobs"),
    ] {
        let e = check_completions(json).unwrap_err();
        assert_eq!(e.param, Some(param), "{json}");
    }
}

#[test]
fn sampling_controls_reach_the_sampler() {
    let c = check(
        r#"{"logprobs": true, "top_logprobs": 3, "n": 3, "frequency_penalty": 1.5,
            "presence_penalty": -0.5, "repeat_last_n": 8,
            "logit_bias": {"5": -100, "7": 2.5}}"#,
    )
    .unwrap();
    assert_eq!(c.n, 3);
    let s = &c.sampler;
    assert_eq!(s.logprobs, Some(3));
    assert_eq!((s.frequency_penalty, s.presence_penalty), (1.5, -0.5));
    assert_eq!(s.repeat_last_n, 8);
    assert_eq!(s.logit_bias, vec![(5, f32::NEG_INFINITY), (7, 2.5)]);
    assert_eq!(
        check(r#"{"logprobs": false}"#).unwrap().sampler.logprobs,
        None
    );
    let c = check_completions(r#"{"logprobs": 0, "echo": true}"#).unwrap();
    assert_eq!((c.sampler.logprobs, c.echo), (Some(0), true));
    assert_eq!(check_completions("{}").unwrap().sampler.logprobs, None);
}

#[test]
fn a_huge_max_tokens_is_capped_by_the_context() {
    let c = check(r#"{"max_tokens": 9223372036854775807}"#).unwrap();
    assert_eq!(
        cap_max_tokens(c.max_tokens, 10, 2048, "prompt").unwrap(),
        2038
    );
    assert_eq!(cap_max_tokens(Some(5), 10, 2048, "prompt").unwrap(), 5);
    assert_eq!(cap_max_tokens(None, 10, 2048, "prompt").unwrap(), 2038);
    let e = cap_max_tokens(Some(5), 2048, 2048, "prompt").unwrap_err();
    assert_eq!(e.code, Some("context_length_exceeded"));
    assert_eq!(e.param, Some("prompt"));
}

#[test]
fn unimplemented_parameters_are_refused_unless_at_their_default() {
    for (json, param) in [
        (r#"{"functions": [{"name": "f"}]}"#, "functions"),
        (r#"{"function_call": "f"}"#, "function_call"),
        (r#"{"best_of": 3}"#, "best_of"),
        (r#"{"suffix": "end"}"#, "suffix"),
    ] {
        let e = check(json).unwrap_err();
        assert_eq!(e.status, 400, "{json}");
        assert_eq!(e.param, Some(param), "{json}");
        assert!(e.message.contains(param), "{json}: {}", e.message);
    }
    for json in [
        r#"{"logprobs": false, "top_logprobs": null, "echo": false, "tools": []}"#,
        r#"{"logprobs": false, "top_logprobs": 0, "tool_choice": "none"}"#,
        r#"{"response_format": {"type": "text"}, "presence_penalty": 0, "frequency_penalty": 0.0}"#,
        r#"{"logit_bias": {}, "best_of": 1, "suffix": ""}"#,
    ] {
        assert!(check(json).is_ok(), "{json}");
    }
}

#[test]
fn text_parts_are_joined_by_newlines() {
    let m: ChatMessage = serde_json::from_str(
        r#"{"role": "user", "content": [{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}]}"#,
    )
    .unwrap();
    assert_eq!(m.text().unwrap(), "One.\nTwo.");
    let m: ChatMessage = serde_json::from_str(
        r#"{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}"#,
    )
    .unwrap();
    assert_eq!(m.text().unwrap_err().param, Some("messages"));
}

#[test]
fn stop_is_a_string_or_a_list() {
    assert_eq!(check(r#"{"stop": "\n"}"#).unwrap().stop, vec!["\n"]);
    assert_eq!(
        check(r#"{"stop": ["a", "b"]}"#).unwrap().stop,
        vec!["a", "b"]
    );
    assert!(serde_json::from_str::<Sampling>(r#"{"stop": 3}"#).is_err());
}

#[test]
fn wrong_types_do_not_parse() {
    assert!(serde_json::from_str::<Sampling>(r#"{"max_tokens": "ten"}"#).is_err());
    assert!(serde_json::from_str::<Sampling>(r#"{"temperature": "hot"}"#).is_err());
    assert!(serde_json::from_str::<ChatRequest>(r#"{"messages": "hi"}"#).is_err());
}
