/* Address -> function name for the harness's backtraces, from the ELF symbol tables.
 *
 * backtrace_symbols() names only exported symbols, and test bodies and most tdist functions are
 * static or hidden, so a hung rank's stack would read "binary(+0x1234)". At rank start-up this file
 * maps each loaded object's file (dl_iterate_phdr) and finds its .symtab (or .dynsym when
 * stripped); looking an address up is then plain memory reads, safe in a fatal-signal handler.
 * Every offset read from a file is bounds-checked against the mapping. */
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testing/harness.h"

#define MAX_OBJECTS 128

typedef struct sym_object {
    uintptr_t bias;     /* run-time address minus link-time address */
    uintptr_t lo, hi;   /* run-time extent of the PT_LOAD segments */
    char path[256];
    const ElfW(Sym) *syms;
    size_t nsyms;
    const char *strtab;
    size_t strsz;
} sym_object;

static sym_object g_objs[MAX_OBJECTS];
static int g_nobjs;
static atomic_bool g_loaded;
static pthread_mutex_t g_init_lock = PTHREAD_MUTEX_INITIALIZER;

static void load_symtab(sym_object *o)
{
    int fd = open(o->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < (off_t)sizeof(ElfW(Ehdr))) {
        close(fd);
        return;
    }
    size_t size = (size_t)st.st_size;
    const unsigned char *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return;
    const ElfW(Ehdr) *eh = (const ElfW(Ehdr) *)m;
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != (sizeof(void *) == 8 ? ELFCLASS64 : ELFCLASS32) ||
        eh->e_shentsize != sizeof(ElfW(Shdr)) || eh->e_shoff == 0 || eh->e_shoff > size ||
        (size_t)eh->e_shnum > (size - eh->e_shoff) / sizeof(ElfW(Shdr)))
        goto unmap;
    const ElfW(Shdr) *sh = (const ElfW(Shdr) *)(m + eh->e_shoff);
    const ElfW(Shdr) *pick = NULL;
    for (int want = SHT_SYMTAB; want; want = want == SHT_SYMTAB ? SHT_DYNSYM : 0) {
        for (size_t i = 0; i < eh->e_shnum && !pick; i++)
            if (sh[i].sh_type == (ElfW(Word))want && sh[i].sh_size > 0)
                pick = &sh[i];
        if (pick)
            break;
    }
    if (!pick || pick->sh_link >= eh->e_shnum || pick->sh_offset > size || pick->sh_size > size - pick->sh_offset)
        goto unmap;
    const ElfW(Shdr) *strs = &sh[pick->sh_link];
    if (strs->sh_offset > size || strs->sh_size > size - strs->sh_offset || strs->sh_size == 0)
        goto unmap;
    o->syms = (const ElfW(Sym) *)(m + pick->sh_offset);
    o->nsyms = pick->sh_size / sizeof(ElfW(Sym));
    o->strtab = (const char *)(m + strs->sh_offset);
    o->strsz = strs->sh_size;
    return; /* the mapping stays for the life of the process */
unmap:
    munmap((void *)m, size);
}

static int on_object(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    (void)arg;
    if (g_nobjs >= MAX_OBJECTS)
        return 1;
    sym_object *o = &g_objs[g_nobjs];
    memset(o, 0, sizeof *o);
    o->bias = (uintptr_t)info->dlpi_addr;
    o->lo = UINTPTR_MAX;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD)
            continue;
        uintptr_t a = o->bias + ph->p_vaddr;
        if (a < o->lo)
            o->lo = a;
        if (a + ph->p_memsz > o->hi)
            o->hi = a + ph->p_memsz;
    }
    if (o->lo >= o->hi)
        return 0;
    if (info->dlpi_name && info->dlpi_name[0]) {
        snprintf(o->path, sizeof o->path, "%s", info->dlpi_name);
    } else if (g_nobjs == 0) {
        ssize_t n = readlink("/proc/self/exe", o->path, sizeof o->path - 1);
        o->path[n > 0 ? n : 0] = '\0';
    }
    if (o->path[0] == '/')
        load_symtab(o);
    g_nobjs++;
    return 0;
}

void symbols_init(void)
{
    if (atomic_load(&g_loaded))
        return;
    pthread_mutex_lock(&g_init_lock);
    if (!atomic_load(&g_loaded)) {
        dl_iterate_phdr(on_object, NULL);
        atomic_store(&g_loaded, true);
    }
    pthread_mutex_unlock(&g_init_lock);
}

/* Signal-safe appends into a fixed buffer. */
typedef struct sbuf {
    char *p;
    size_t size, len;
} sbuf;

static void put_str(sbuf *b, const char *s)
{
    while (*s && b->len + 1 < b->size)
        b->p[b->len++] = *s++;
    b->p[b->len] = '\0';
}

static void put_strn(sbuf *b, const char *s, size_t n)
{
    for (size_t i = 0; i < n && s[i] && b->len + 1 < b->size; i++)
        b->p[b->len++] = s[i];
    b->p[b->len] = '\0';
}

static void put_hex(sbuf *b, uintptr_t v)
{
    char tmp[2 + 2 * sizeof v + 1];
    size_t n = 0;
    do {
        tmp[n++] = "0123456789abcdef"[v & 15];
        v >>= 4;
    } while (v);
    put_str(b, "0x");
    while (n > 0 && b->len + 1 < b->size)
        b->p[b->len++] = tmp[--n];
    b->p[b->len] = '\0';
}

void symbols_describe(uintptr_t addr, char *out, size_t size)
{
    sbuf b = {out, size, 0};
    if (size == 0)
        return;
    out[0] = '\0';
    if (!atomic_load(&g_loaded))
        return;
    for (int i = 0; i < g_nobjs; i++) {
        const sym_object *o = &g_objs[i];
        if (addr < o->lo || addr >= o->hi)
            continue;
        uintptr_t key = addr - o->bias;
        const ElfW(Sym) *best = NULL;
        for (size_t k = 0; k < o->nsyms; k++) {
            const ElfW(Sym) *s = &o->syms[k];
            int type = ELF64_ST_TYPE(s->st_info);
            if ((type != STT_FUNC && type != STT_GNU_IFUNC) || s->st_shndx == SHN_UNDEF || s->st_value > key)
                continue;
            if (s->st_size > 0 && key >= s->st_value + s->st_size)
                continue;
            if (!best || s->st_value > best->st_value || (s->st_value == best->st_value && s->st_size > 0))
                best = s;
        }
        if (best && best->st_name < o->strsz) {
            put_str(&b, " in ");
            put_strn(&b, o->strtab + best->st_name, o->strsz - best->st_name);
            put_str(&b, "+");
            put_hex(&b, key - best->st_value);
        }
        if (o->path[0]) {
            put_str(&b, " (");
            put_str(&b, o->path);
            put_str(&b, "+");
            put_hex(&b, key);
            put_str(&b, ")");
        }
        return;
    }
}
