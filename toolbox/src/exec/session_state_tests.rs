use super::*;

#[test]
fn per_call_variables_override_and_a_user_bash_env_is_passed_aside() {
    let session = vec![("A".into(), "1".into()), ("BASH_ENV".into(), "/u.sh".into())];
    let env = command_env(&session, &[("A".into(), "2".into()), ("B".into(), "3".into())]);
    assert_eq!(
        env,
        vec![("A".into(), "2".into()), (USER_BASH_ENV_VAR.into(), "/u.sh".into()), ("B".into(), "3".into())]
    );
}

#[test]
fn state_file_updates_cwd_and_env_but_not_per_call_or_plumbing_variables() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("state");
    let mut state = SessionState {
        cwd: "/".into(),
        start_dir: "/".into(),
        env: vec![("SHLVL".into(), "1".into()), ("KEEP".into(), "old".into())],
        seq: 0,
        leftovers: Vec::new(),
    };
    let mut data = format!("{}\0", dir.path().display()).into_bytes();
    data.extend(
        b"declare -x KEEP=\"given\"\ndeclare -x NEW=\"a=b\nc\"\ndeclare -x SHLVL=\"2\"\n\
          declare -x _=\"/bin/ls\"\ndeclare -x ONCE=\"x\"\n",
    );
    std::fs::write(&file, data).unwrap();
    state.apply_state_file(&file, &[("KEEP".into(), "given".into()), ("ONCE".into(), "x".into())]);
    assert_eq!(state.cwd, dir.path());
    assert_eq!(
        state.env,
        vec![("KEEP".into(), "old".into()), ("NEW".into(), "a=b\nc".into()), ("SHLVL".into(), "1".into())]
    );
}
