/* The assignment of input images and masks to an edit's outputs
 * (edit_images.h: Diffusers' image-list semantics). */
#include "engine/pipeline/edit_images.h"

#include "engine/core/error.h"

int ditd_edit_images_check(int n, int k, int m)
{
    if (k < 1 || k > DITD_EDIT_MAX_IMAGES)
        return ditd_err_set(DITD_EINVAL, "image: %d input images (1 to %d)", k,
                            DITD_EDIT_MAX_IMAGES);
    if (n < 1 || n % k != 0)
        return ditd_err_set(DITD_EINVAL, "n = %d outputs from %d input images (image): n must be "
                            "a multiple of the number of images (output i edits image i mod %d, "
                            "as Diffusers repeats an image list)", n, k, k);
    if (m < 0 || (m > 1 && m != k))
        return ditd_err_set(DITD_EINVAL, "mask: %d masks for %d input images (one mask for all, "
                            "or one per image)", m, k);
    return 0;
}

int ditd_edit_image_of(int i, int k)
{
    return k > 0 ? i % k : 0;
}

int ditd_edit_mask_of(int i, int m)
{
    return m > 0 ? i % m : 0;
}
