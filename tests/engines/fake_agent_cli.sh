#!/bin/sh
# A stand-in for the agent CLIs of the engine presets, written from their documented
# output shapes (no real CLI is run). Installed in a test's bin directory under the
# name `claude`, `codex` or `gemini`, it answers as that CLI would in the preset's
# mode. $FAKE_CLI_MODE_FILE holds `ok` or `logged_out`.
mode=$(cat "$FAKE_CLI_MODE_FILE" 2>/dev/null || echo ok)
case "$(basename "$0")" in
claude)
    [ "$*" = "-p --output-format json" ] || { echo "unexpected arguments: $*" >&2; exit 2; }
    prompt=$(cat)
    if [ "$mode" = logged_out ]; then
        printf '{"type":"result","subtype":"success","is_error":true,"duration_ms":40,"num_turns":1,"result":"Not logged in \302\267 Please run /login","session_id":"c-0001","total_cost_usd":0,"usage":{"input_tokens":0,"output_tokens":0}}\n'
        exit 1
    fi
    printf '{"type":"result","subtype":"success","is_error":false,"duration_ms":900,"num_turns":1,"result":"claude says: %s","session_id":"c-0001","total_cost_usd":0.02,"usage":{"input_tokens":11,"output_tokens":5,"cache_read_input_tokens":3}}\n' "$prompt"
    ;;
codex)
    [ "$*" = "exec --json --skip-git-repo-check -" ] || { echo "unexpected arguments: $*" >&2; exit 2; }
    prompt=$(cat)
    echo "Reading prompt from stdin..." >&2
    printf '{"type":"thread.started","thread_id":"x-0002"}\n{"type":"turn.started"}\n'
    if [ "$mode" = logged_out ]; then
        printf '{"type":"error","message":"unexpected status 401 Unauthorized: Missing bearer authentication in header"}\n'
        printf '{"type":"turn.failed","error":{"message":"unexpected status 401 Unauthorized: Missing bearer authentication in header"}}\n'
        exit 1
    fi
    printf '{"type":"item.completed","item":{"id":"item_0","type":"reasoning","text":"thinking"}}\n'
    printf '{"type":"item.completed","item":{"id":"item_1","type":"agent_message","text":"codex says: %s"}}\n' "$prompt"
    printf '{"type":"turn.completed","usage":{"input_tokens":21,"cached_input_tokens":7,"output_tokens":6}}\n'
    ;;
gemini)
    [ "$#" -eq 4 ] && [ "$1 $2 $3" = "--output-format json -p" ] || { echo "unexpected arguments: $*" >&2; exit 2; }
    # The prompt is the value of -p; stdin is closed (read as empty).
    [ -z "$(cat)" ] || { echo "stdin was not empty" >&2; exit 2; }
    if [ "$mode" = logged_out ]; then
        printf '{"session_id":"g-0003","error":{"type":"Error","message":"Please set an Auth method in your settings.json or specify one of the following environment variables before running: GEMINI_API_KEY","code":41}}\n'
        exit 41
    fi
    printf '{"session_id":"g-0003","response":"gemini says: %s","stats":{"models":{"gemini-2.5-pro":{"tokens":{"prompt":31,"candidates":8,"total":39,"cached":2,"thoughts":0,"tool":0}}}}}\n' "$4"
    ;;
*)
    echo "fake_agent_cli.sh: unknown name $(basename "$0")" >&2
    exit 2
    ;;
esac
