# Sourced by paper_dry_run.sh and vllm_cpu_check.sh (after TMP is set): check NAME COMMAND... runs the command,
# which prints its own "ok NAME ..." or "FAIL NAME ..." line; a crash becomes a FAIL line with its last error.
# PASSED and TOTAL count them for the script's last line.
PASSED=0 TOTAL=0

check() {
    local name=$1 line
    shift
    TOTAL=$((TOTAL + 1))
    "$@" > "$TMP/$name.out" 2> "$TMP/$name.err"
    line=$(grep -E "^(ok|FAIL) $name( |$)" "$TMP/$name.out" | tail -n 1)
    [ -n "$line" ] || line="FAIL $name ($(tr '\r' '\n' < "$TMP/$name.err" | grep -v '^\s*$' | tail -n 1))"
    echo "$line"
    case $line in ok*) PASSED=$((PASSED + 1)) ;; esac
}
