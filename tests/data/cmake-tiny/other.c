#include <stdio.h>

int main(void) {
    printf("other\n");
    return 0;
}
