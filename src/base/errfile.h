/* torchrun's error file (TORCHELASTIC_ERROR_FILE), written by the library: see errfile.c. */
#ifndef TDIST_BASE_ERRFILE_H
#define TDIST_BASE_ERRFILE_H

/* Records message as this process's failure unless a record exists already; keeps the thread's
 * last error. Nothing happens without TORCHELASTIC_ERROR_FILE. */
void errfile_record(const char *message);

#endif
