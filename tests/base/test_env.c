/* Environment and string parsing (base/env.h): every parser's accepted forms, defaults for unset
 * and empty variables, and the exact error texts. Each case runs in its own process, so setenv
 * here touches no other test. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <tdist/testing.h>

#include "base/env.h"
#include "base/error.h"

TD_TEST(env_int)
{
    int64_t v = -1;
    unsetenv("TDIST_T_INT");
    TD_CHECK_OK(env_get_int("TDIST_T_INT", 7, 0, 100, &v));
    TD_CHECK_EQ(v, 7);
    setenv("TDIST_T_INT", "", 1);
    TD_CHECK_OK(env_get_int("TDIST_T_INT", 8, 0, 100, &v));
    TD_CHECK_EQ(v, 8);
    setenv("TDIST_T_INT", "42", 1);
    TD_CHECK_OK(env_get_int("TDIST_T_INT", 7, 0, 100, &v));
    TD_CHECK_EQ(v, 42);
    setenv("TDIST_T_INT", "0x10", 1);
    TD_CHECK_OK(env_get_int("TDIST_T_INT", 7, 0, 100, &v));
    TD_CHECK_EQ(v, 16);
    setenv("TDIST_T_INT", "-5", 1);
    TD_CHECK_OK(env_get_int("TDIST_T_INT", 7, -10, 100, &v));
    TD_CHECK_EQ(v, -5);

    v = 99;
    setenv("TDIST_T_INT", "abc", 1);
    TD_CHECK_ERR(env_get_int("TDIST_T_INT", 7, 0, 100, &v), TD_ERR_INVALID, NULL);
    TD_CHECK_STR_EQ(td_last_error(), "TDIST_T_INT must be an integer, got 'abc'");
    TD_CHECK_EQ(v, 99); /* untouched on error */
    setenv("TDIST_T_INT", "12abc", 1);
    TD_CHECK_ERR(env_get_int("TDIST_T_INT", 7, 0, 100, &v), TD_ERR_INVALID, "must be an integer, got '12abc'");
    setenv("TDIST_T_INT", "101", 1);
    TD_CHECK_ERR(env_get_int("TDIST_T_INT", 7, 0, 100, &v), TD_ERR_INVALID, NULL);
    TD_CHECK_STR_EQ(td_last_error(), "TDIST_T_INT must be between 0 and 100, got 101");
    setenv("TDIST_T_INT", "99999999999999999999999", 1);
    TD_CHECK_ERR(env_get_int("TDIST_T_INT", 7, 0, 100, &v), TD_ERR_INVALID, "must be an integer");
    unsetenv("TDIST_T_INT");

    /* WORLD_SIZE-style validation of a string (trap T10) */
    TD_CHECK_ERR(env_parse_int("WORLD_SIZE", "4 ", 1, 64, &v), TD_ERR_INVALID, "WORLD_SIZE must be an integer, got '4 '");
    TD_CHECK_OK(env_parse_int("WORLD_SIZE", "4", 1, 64, &v));
    TD_CHECK_EQ(v, 4);
}

TD_TEST(env_bool)
{
    static const char *const yes[] = {"1", "true", "TRUE", "yes", "On", "y"};
    static const char *const no[] = {"0", "false", "No", "off", "OFF", "n"};
    bool b;
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++) {
        setenv("TDIST_T_BOOL", yes[i], 1);
        b = false;
        TD_CHECK_OK(env_get_bool("TDIST_T_BOOL", false, &b));
        TD_CHECK_MSG(b, "'%s' should be true", yes[i]);
    }
    for (size_t i = 0; i < sizeof no / sizeof *no; i++) {
        setenv("TDIST_T_BOOL", no[i], 1);
        b = true;
        TD_CHECK_OK(env_get_bool("TDIST_T_BOOL", true, &b));
        TD_CHECK_MSG(!b, "'%s' should be false", no[i]);
    }
    setenv("TDIST_T_BOOL", "maybe", 1);
    TD_CHECK_ERR(env_get_bool("TDIST_T_BOOL", false, &b), TD_ERR_INVALID, NULL);
    TD_CHECK_STR_EQ(td_last_error(), "TDIST_T_BOOL must be a boolean (1/0, true/false, yes/no, on/off), got 'maybe'");
    unsetenv("TDIST_T_BOOL");
    TD_CHECK_OK(env_get_bool("TDIST_T_BOOL", true, &b));
    TD_CHECK(b);
}

TD_TEST(env_duration)
{
    static const struct {
        const char *text;
        int64_t unit, want;
    } ok[] = {
        {"500ms", 1000, 500}, {"30s", 1, 30000}, {"5m", 1, 300000},   {"5min", 1, 300000}, {"2h", 1, 7200000},
        {"3", 1000, 3000},    {"3", 1, 3},       {"1.5s", 1, 1500},   {"0", 1000, 0},      {"0.25", 1000, 250},
    };
    int64_t ms;
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        setenv("TDIST_T_DUR", ok[i].text, 1);
        ms = -1;
        TD_CHECK_OK(env_get_duration_ms("TDIST_T_DUR", 1, ok[i].unit, &ms));
        TD_CHECK_MSG(ms == ok[i].want, "'%s' gave %lld ms, want %lld", ok[i].text, (long long)ms, (long long)ok[i].want);
    }
    static const char *const bad[] = {"abc", "-1", "5x", "s", "1e400", "nan"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv("TDIST_T_DUR", bad[i], 1);
        TD_CHECK_ERR(env_get_duration_ms("TDIST_T_DUR", 1, 1000, &ms), TD_ERR_INVALID, NULL);
        char want[128];
        snprintf(want, sizeof want, "TDIST_T_DUR must be a duration such as 500ms, 30s or 5m, got '%s'", bad[i]);
        TD_CHECK_STR_EQ(td_last_error(), want);
    }
    unsetenv("TDIST_T_DUR");
    TD_CHECK_OK(env_get_duration_ms("TDIST_T_DUR", 1234, 1000, &ms));
    TD_CHECK_EQ(ms, 1234);
}

TD_TEST(parse_size)
{
    static const struct {
        const char *text;
        uint64_t want;
    } ok[] = {
        {"4096", 4096}, {"64K", 65536}, {"64k", 65536}, {"16M", 16u << 20}, {"1G", 1u << 30},
        {"1KiB", 1024}, {"2kb", 2048},  {"0", 0},       {"3MB", 3u << 20},
    };
    uint64_t v;
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        TD_CHECK_OK(env_parse_size("TDIST_T_SIZE", ok[i].text, &v));
        TD_CHECK_MSG(v == ok[i].want, "'%s' gave %llu", ok[i].text, (unsigned long long)v);
    }
    static const char *const bad[] = {"-1", "12Q", "", "K", "1KX", "99999999999999999999G", "17179869184G"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        TD_CHECK_ERR(env_parse_size("TDIST_T_SIZE", bad[i], &v), TD_ERR_INVALID, NULL);
        char want[128];
        snprintf(want, sizeof want, "TDIST_T_SIZE must be a size such as 4096, 64K or 16M, got '%s'", bad[i]);
        TD_CHECK_STR_EQ(td_last_error(), want);
    }
}

TD_TEST(env_enum)
{
    static const char *const levels[] = {"OFF", "INFO", "DETAIL", NULL};
    static const char *const two[] = {"ring", "tree", NULL};
    int idx = -1;
    unsetenv("TDIST_T_DEBUG");
    TD_CHECK_OK(env_get_enum("TDIST_T_DEBUG", levels, 1, &idx));
    TD_CHECK_EQ(idx, 1);
    setenv("TDIST_T_DEBUG", "detail", 1);
    TD_CHECK_OK(env_get_enum("TDIST_T_DEBUG", levels, 0, &idx));
    TD_CHECK_EQ(idx, 2);
    setenv("TDIST_T_DEBUG", "verbose", 1);
    TD_CHECK_ERR(env_get_enum("TDIST_T_DEBUG", levels, 0, &idx), TD_ERR_INVALID, NULL);
    TD_CHECK_STR_EQ(td_last_error(), "The value of TDIST_T_DEBUG must be OFF, INFO, or DETAIL. Got 'verbose'.");
    setenv("TDIST_T_DEBUG", "star", 1);
    TD_CHECK_ERR(env_get_enum("TDIST_T_DEBUG", two, 0, &idx), TD_ERR_INVALID, NULL);
    TD_CHECK_STR_EQ(td_last_error(), "The value of TDIST_T_DEBUG must be ring or tree. Got 'star'.");
    unsetenv("TDIST_T_DEBUG");
}

TD_TEST(env_str)
{
    unsetenv("TDIST_T_STR");
    TD_CHECK_STR_EQ(env_get_str("TDIST_T_STR", "dflt"), "dflt");
    TD_CHECK(env_get_str("TDIST_T_STR", NULL) == NULL);
    setenv("TDIST_T_STR", "", 1);
    TD_CHECK_STR_EQ(env_get_str("TDIST_T_STR", "dflt"), "dflt");
    setenv("TDIST_T_STR", "eth0", 1);
    TD_CHECK_STR_EQ(env_get_str("TDIST_T_STR", "dflt"), "eth0");
    unsetenv("TDIST_T_STR");
}

TD_TEST(parse_bool_and_duration_strings)
{
    bool b;
    TD_CHECK_ERR(env_parse_bool("url parameter wait", "2", &b), TD_ERR_INVALID,
                 "url parameter wait must be a boolean (1/0, true/false, yes/no, on/off), got '2'");
    int64_t ms;
    TD_CHECK_OK(env_parse_duration_ms("timeout", "1.5m", 1, &ms));
    TD_CHECK_EQ(ms, 90000);
}
