"""Hostile C++ programs for the sandbox tests (the C++ twins of test_sandbox_hostile.py's).

Run-time attacks print 3 (the answer of the test case) only if the attack got through, so
a contained attack scores 0 through the `code` reward. Compile-time bombs never produce a
program: their status comes from the compiler's run (killed by a limit, or a compile error).
"""

from __future__ import annotations

INC = "#include <cstdio>\n#include <cstdlib>\n#include <cstring>\n#include <unistd.h>\n"


def runtime_programs(marker: str, port: int, project_file: str, home: str, repo: str) -> dict:
    P = {}
    P["loop"] = "int main() { volatile unsigned long x = 0; for (;;) x++; }\n"
    P["sleep"] = INC + 'int main() { sleep(600); puts("3"); }\n'
    P["fork_bomb"] = INC + "int main() { for (;;) fork(); }\n"
    P["memory_bomb"] = INC + (
        "int main() { size_t n = 3UL << 30; char *volatile p = new char[n];\n"
        '  memset(p, 1, n); printf("%d\\n", 2 + p[n - 1]); }\n'
    )
    P["huge_file"] = INC + (
        'int main() { FILE *f = fopen("big", "wb"); static char b[1 << 20]; size_t n = 0;\n'
        "  for (int i = 0; i < 100; i++) n += fwrite(b, 1, sizeof b, f);\n"
        '  if (fclose(f) == 0 && n == 100u << 20) puts("3"); }\n'
    )
    P["read_project"] = INC + (
        f'int main() {{ FILE *f = fopen("{project_file}", "r"); char b[4096] = {{0}};\n'
        "  if (f) fread(b, 1, sizeof b - 1, f);\n"
        '  puts(f && strstr(b, "grpokit") ? "3" : "0"); }\n'
    )
    P["read_home"] = (
        "#include <dirent.h>\n"
        + INC
        + (
            f'int main() {{ DIR *d = opendir("{home}"); int n = 0; struct dirent *e;\n'
            "  while (d && (e = readdir(d))) if (e->d_name[0] != '.') n++;\n"
            '  puts(n ? "3" : "0"); }\n'
        )
    )
    P["see_processes"] = (
        "#include <dirent.h>\n#include <cctype>\n"
        + INC
        + (
            'int main() { DIR *d = opendir("/proc"); int n = 0; struct dirent *e;\n'
            "  while (d && (e = readdir(d))) if (isdigit(e->d_name[0])) n++;\n"
            '  puts(n > 10 ? "3" : "0"); }\n'
        )
    )
    P["write_outside"] = INC + (
        f'int main() {{ const char *ds[] = {{"{repo}", "{home}", "/var/tmp", "/"}};\n'
        "  int ok = 0; char path[4096];\n"
        "  for (const char *d : ds) {\n"
        f'    snprintf(path, sizeof path, "%s/{marker}-file", d);\n'
        '    FILE *f = fopen(path, "w"); if (f) { fputs("x", f); fclose(f); ok++; } }\n'
        '  puts(ok ? "3" : "0"); }\n'
    )
    P["network"] = (
        "#include <arpa/inet.h>\n#include <sys/socket.h>\n"
        + INC
        + (
            "int main() { int s = socket(AF_INET, SOCK_STREAM, 0); if (s < 0) return 1;\n"
            f"  sockaddr_in a{{}}; a.sin_family = AF_INET; a.sin_port = htons({port});\n"
            '  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);\n'
            "  if (connect(s, (sockaddr *)&a, sizeof a) != 0) return 1;\n"
            f'  send(s, "{marker}", {len(marker)}, 0); puts("3"); }}\n'
        )
    )
    P["kill_parent"] = (
        "#include <csignal>\n" + INC + ('int main() { if (kill(getppid(), 9) == 0) puts("3"); }\n')
    )
    P["kill_all"] = (
        "#include <csignal>\n" + INC + 'int main() { if (kill(-1, 9) == 0) puts("3"); }\n'
    )
    detach = (
        "#include <csignal>\n"
        + INC
        + (
            "int main() {\n  if (fork() == 0) { setsid();\n"
            f'    if (fork() == 0) execl("/bin/sh", "sh", "-c", "sleep 60", "{marker}", (char *)0);\n'
            "    _exit(0); }\n"
        )
    )
    P["detached_child"] = detach + "}\n"
    P["solves_then_detaches"] = detach + '  puts("3");\n}\n'  # honest: it does answer
    P["gigabytes"] = INC + (
        "int main() { static char b[1 << 20]; memset(b, 'x', sizeof b);\n"
        "  for (;;) fwrite(b, 1, sizeof b, stdout); }\n"
    )
    P["stderr_gigabytes"] = P["gigabytes"].replace("stdout", "stderr")
    P["segfault"] = "int main() { volatile int *p = nullptr; return *p; }\n"
    # sees the project's file at compile time? prints 3 if so
    P["compile_sees_project"] = (
        f'#include <cstdio>\n#if __has_include("{project_file}")\n'
        'int main() { puts("3"); }\n#else\nint main() { puts("0"); }\n#endif\n'
    )
    return P


def compile_bombs() -> dict:
    B = {}
    B["include_dev_zero"] = '#include "/dev/zero"\nint main() {}\n'
    B["include_dev_random"] = '#include "/dev/random"\nint main() {}\n'
    B["include_self"] = "#include __FILE__\n"
    B["template_depth"] = (
        "#include <cstdio>\ntemplate <int N> struct F { enum { v = F<N - 1>::v + 1 }; };\n"
        "template <> struct F<0> { enum { v = 0 }; };\n"
        'int main() { printf("%d\\n", F<100000>::v - 99997); }\n'
    )
    # ~4e10 constexpr steps: GCC would give up only after minutes of CPU
    B["constexpr_cpu"] = (
        "#include <cstdio>\nconstexpr long f() { long s = 0;\n"
        "  for (long i = 0; i < 200000; i++) for (long j = 0; j < 200000; j++) s += i ^ j;\n"
        "  return s; }\nconstexpr long x = f();\n"
        'int main() { printf("%ld\\n", x); }\n'
    )
    # 10^9 tokens from a few lines of macros
    B["macro_explosion"] = (
        "#define A0 x x x x x x x x x x\n"
        + "".join(
            f"#define A{i} A{i - 1} A{i - 1} A{i - 1} A{i - 1} A{i - 1} A{i - 1} A{i - 1} "
            f"A{i - 1} A{i - 1} A{i - 1}\n"
            for i in range(1, 9)
        )
        + "int A8;\nint main() {}\n"
    )
    B["huge_static_array"] = (
        "#include <cstdio>\nchar big[1L << 31] = {1};\n"
        'int main() { printf("%d\\n", big[0] + 2); }\n'
    )
    return B
